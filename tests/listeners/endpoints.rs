//! Which listener serves which endpoint, through the binary, against what `serve --help` and
//! docs/flags.md say of `--http-addr` and `--admin-addr`: an endpoint served is named for its
//! listener, and an endpoint named is served there.

use crate::support::{Slidegate, slidegate_command};

/// (path, method) of every HTTP endpoint, and the listeners that serve it.
const ENDPOINTS: [(&str, &str, bool, bool); 10] = [
    // path, method, on the HTTP port, on the operator listener
    ("/json", "POST", true, false),
    ("/check", "GET", true, false),
    ("/healthcheck", "GET", true, true),
    ("/metrics", "GET", false, true),
    ("/rlconfig", "GET", false, true),
    ("/explain", "POST", false, true),
    ("/limited", "GET", false, true),
    ("/counters", "DELETE", false, true),
    ("/status.json", "GET", false, true),
    ("/page.js", "GET", false, true),
];

/// The help or docs text of one flag: from its name to the next flag.
fn about<'a>(text: &'a str, flag: &str) -> &'a str {
    let start = text
        .find(flag)
        .unwrap_or_else(|| panic!("{flag} is not described"));
    let rest = &text[start + flag.len()..];
    let end = rest
        .find("\n      --")
        .or_else(|| rest.find("\n| `--"))
        .unwrap_or(rest.len());
    &rest[..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_listener_serves_what_its_help_and_docs_name() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let server = Slidegate::start(&config, &[]);
    let client = reqwest::Client::new();
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    for (path, method, on_http, on_admin) in ENDPOINTS {
        for (port, expected, listener) in [
            (server.http_port, on_http, "HTTP port"),
            (server.admin_port, on_admin, "operator listener"),
        ] {
            let url = format!("http://127.0.0.1:{port}{path}");
            let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
            let request = client.request(method.clone(), url);
            let request = if method == reqwest::Method::GET {
                request
            } else {
                request.body(body)
            };
            let status = request.send().await.expect("request").status().as_u16();
            assert_eq!(
                status != 404,
                expected,
                "{method} {path} on the {listener}: {status}"
            );
        }
    }

    let help = slidegate_command()
        .args(["serve", "--help"])
        .output()
        .expect("serve --help");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let flags = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/flags.md"),
    )
    .expect("docs/flags.md");
    for (text, source) in [(&help, "serve --help"), (&flags, "docs/flags.md")] {
        let http = about(text, "--http-addr");
        let admin = about(text, "--admin-addr");
        for (path, _, on_http, on_admin) in ENDPOINTS {
            if path == "/page.js" {
                continue;
            }
            assert_eq!(
                http.contains(path),
                on_http,
                "{source}, --http-addr and {path}: {http}"
            );
            assert_eq!(
                admin.contains(path),
                on_admin,
                "{source}, --admin-addr and {path}: {admin}"
            );
        }
    }
}
