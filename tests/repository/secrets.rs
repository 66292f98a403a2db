//! Secrets stay out of what slidegate prints: `--help` shows no environment value of a flag that
//! can carry a password (Redis URLs, cluster and sentinel lists, the OTLP endpoint).

use crate::support::slidegate_command;

#[test]
fn help_prints_no_secret_from_the_environment() {
    let secret = "hunter2-in-the-environment";
    let output = slidegate_command()
        .args(["serve", "--help"])
        .env(
            "SLIDEGATE_REDIS_URL",
            format!("redis://:{secret}@127.0.0.1:6379"),
        )
        .env(
            "SLIDEGATE_REDIS_CLUSTER",
            format!("redis://:{secret}@127.0.0.1:7000"),
        )
        .env(
            "SLIDEGATE_REDIS_SENTINEL",
            format!("rediss://:{secret}@127.0.0.1:26379"),
        )
        .env("SLIDEGATE_REDIS_SENTINEL_PASSWORD", secret)
        .env(
            "SLIDEGATE_OTLP_ENDPOINT",
            format!("http://user:{secret}@127.0.0.1:4318"),
        )
        .output()
        .expect("slidegate serve --help");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("SLIDEGATE_REDIS_URL"), "{text}");
    assert!(!text.contains(secret), "a secret in --help:\n{text}");
}
