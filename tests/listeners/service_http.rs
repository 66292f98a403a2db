//! The HTTP transports of the data port: `POST /json` (status codes, body, field spellings, size
//! limit) and `/check` (allow and deny by headers, `x-ratelimit-deny-status`, several descriptors,
//! percent-decoding, `--check-domain`).

use crate::service_fixture::Server;
use crate::support::{call, descriptor, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoint_status_codes_and_body() {
    let server = Server::start(&["--max-body-bytes", "1024"]);
    let http = reqwest::Client::new();
    let post = |body: String| http.post(server.url("/json")).body(body).send();
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"j"}]}],"hitsAddend":1}"#;
    let r = post(body.into()).await.expect("POST /json");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["ratelimit-remaining"], "2");
    let v: serde_json::Value = r.json().await.expect("json body");
    assert_eq!(v["overallCode"], "OK");
    let s = &v["statuses"][0];
    assert_eq!(s["code"], "OK");
    assert_eq!(s["currentLimit"]["requestsPerUnit"], 3);
    assert_eq!(s["currentLimit"]["unit"], "MINUTE");
    assert_eq!(s["currentLimit"]["name"], "per_user");
    assert_eq!(s["limitRemaining"], 2);
    let reset = s["durationUntilReset"].as_str().expect("duration string");
    assert!(
        reset.ends_with('s') && reset.trim_end_matches('s').parse::<f64>().is_ok(),
        "{reset}"
    );
    assert!(v["responseHeadersToAdd"].is_array());

    // snake_case field names, integers as strings, hits over the rest of the limit: 429.
    let snake = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"j"}],"hits_addend":"3"}]}"#;
    let r = post(snake.into()).await.expect("POST /json");
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: serde_json::Value = r.json().await.expect("json body");
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");

    // Bad bodies and bad requests: 400 with a message.
    for (body, expected) in [
        ("{", "invalid JSON"),
        (
            r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","valeu":"j"}]}]}"#,
            "unknown field",
        ),
        (
            r#"{"domain":"","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}"#,
            "domain must not be empty",
        ),
        (
            r#"{"domain":"test","descriptors":[]}"#,
            "descriptor list must not be empty",
        ),
    ] {
        let r = post(body.into()).await.expect("POST /json");
        assert_eq!(r.status(), 400, "{body}");
        let text = r.text().await.unwrap_or_default();
        assert!(text.contains(expected), "{text:?} lacks {expected:?}");
    }
    // Over --max-body-bytes: 413.
    let big = format!(
        r#"{{"domain":"test","descriptors":[{{"entries":[{{"key":"user","value":"{}"}}]}}]}}"#,
        "x".repeat(2000)
    );
    assert_eq!(post(big).await.expect("POST /json").status(), 413);
    // Only POST.
    assert_eq!(server.get("/json").await.status(), 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_endpoint_allows_and_denies_in_both_forms() {
    let server = Server::start(&[]);
    let http = reqwest::Client::new();
    let check = |descriptor: &str, deny: Option<&str>| {
        let mut r = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "test")
            .header("x-ratelimit-descriptor", descriptor);
        if let Some(status) = deny {
            r = r.header("x-ratelimit-deny-status", status);
        }
        r.send()
    };
    for remaining in ["2", "1", "0"] {
        let r = check("user=c", None).await.expect("check");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["ratelimit-limit"], "3");
        assert_eq!(r.headers()["ratelimit-remaining"], remaining);
        assert_eq!(r.headers()["ratelimit-policy"], "3;w=60");
        assert!(!r.headers().contains_key("retry-after"));
    }
    let r = check("user=c", None).await.expect("check");
    assert_eq!(r.status(), 429);
    assert!(
        r.headers()["retry-after"]
            .to_str()
            .is_ok_and(|v| v.parse::<u64>().is_ok_and(|s| s > 0))
    );
    assert!(!r.headers().contains_key("x-ratelimit-over"));
    let r = check("user=c", Some("403")).await.expect("check");
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["x-ratelimit-over"], "1");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["ratelimit-remaining"], "0");

    // Any method; several descriptors as repeated headers; percent-decoding. The counter of the
    // value "a,b=c" is the same one /json sees.
    let r = http
        .post(server.url("/check"))
        .header("x-ratelimit-domain", "test")
        .header("x-ratelimit-descriptor", "user=a%2Cb%3Dc")
        .header("x-ratelimit-descriptor", "window=w")
        .header("x-ratelimit-hits", "2")
        .send()
        .await
        .expect("check");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["ratelimit-remaining"], "1");
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"a,b=c"}],"hitsAddend":0}]}"#;
    let v: serde_json::Value = http
        .post(server.url("/json"))
        .body(body)
        .send()
        .await
        .expect("json")
        .json()
        .await
        .expect("json body");
    assert_eq!(v["statuses"][0]["limitRemaining"], 1);

    // Bad headers: 400 with a message.
    for (name, value, expected) in [
        (
            "x-ratelimit-descriptor",
            "user=%zz",
            "invalid percent-encoding",
        ),
        ("x-ratelimit-descriptor", "user", "not key=value"),
        ("x-ratelimit-hits", "many", "x-ratelimit-hits"),
        ("x-ratelimit-deny-status", "418", "must be 429 or 403"),
    ] {
        let mut r = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "test");
        if name != "x-ratelimit-descriptor" {
            r = r.header("x-ratelimit-descriptor", "user=z");
        }
        let r = r.header(name, value).send().await.expect("check");
        assert_eq!(r.status(), 400, "{name}: {value}");
        let text = r.text().await.unwrap_or_default();
        assert!(text.contains(expected), "{text:?} lacks {expected:?}");
    }
    let no_domain = http
        .get(server.url("/check"))
        .header("x-ratelimit-descriptor", "user=z")
        .send()
        .await
        .expect("check");
    assert_eq!(no_domain.status(), 400);
    let no_descriptor = http
        .get(server.url("/check"))
        .header("x-ratelimit-domain", "test")
        .send()
        .await
        .expect("check");
    assert_eq!(no_descriptor.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_domain_flag_is_the_default_domain() {
    let server = Server::start(&["--check-domain", "test", "--response-headers=false"]);
    let r = reqwest::Client::new()
        .get(server.url("/check"))
        .header("x-ratelimit-descriptor", "user=d")
        .send()
        .await
        .expect("check");
    assert_eq!(r.status(), 200);
    assert!(
        !r.headers().contains_key("ratelimit-limit"),
        "headers are off"
    );
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request("test", vec![descriptor(&[("user", "d")])]),
    )
    .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "the check counted in domain test"
    );
    assert!(r.response_headers_to_add.is_empty());
}
