//! The rule loader: any bytes as a rule file give rules or errors naming the file.

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    if let Err(errors) = slidegate::config::load_sources(&[("f.yaml".to_string(), text)]) {
        assert!(!errors.0.is_empty());
        for error in &errors.0 {
            assert_eq!(error.file, "f.yaml");
            assert!(!error.message.is_empty());
        }
    }
}
