//! The rule loader: any bytes as a rule file give rules or errors naming the file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    if let Err(errors) = slidegate::config::load_sources(&[("f.yaml".to_string(), text)]) {
        for error in &errors.0 {
            assert_eq!(error.file, "f.yaml");
            assert!(!error.message.is_empty());
        }
    }
});
