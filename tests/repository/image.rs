//! The image and the Kubernetes manifests agree on who runs it: the Dockerfile's runtime stage
//! creates the user and group with fixed ids and runs as them by number (a pod with only
//! `runAsNonRoot: true` is refused when the image's user is a name, since the kubelet cannot
//! tell whether a name is root), and every pod of `deploy/kubernetes` that runs the image sets
//! the same `runAsUser` and `runAsGroup`.

use std::path::Path;

use serde::Deserialize as _;
use serde_yaml::Value;

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The last stage of the Dockerfile: the image that runs.
fn runtime_stage(dockerfile: &str) -> &str {
    let start = dockerfile.rfind("\nFROM ").expect("a FROM line");
    &dockerfile[start..]
}

/// The ids after `flag` in the stage's `RUN` lines (`--uid 10001`).
fn option(stage: &str, flag: &str) -> Option<u32> {
    let mut words = stage.split_whitespace();
    words.find(|word| *word == flag)?;
    words.next()?.parse().ok()
}

#[test]
fn the_image_runs_as_the_numeric_user_the_manifests_name() {
    let dockerfile = read("Dockerfile");
    let stage = runtime_stage(&dockerfile);
    let user = (stage.lines())
        .filter_map(|line| line.strip_prefix("USER "))
        .next_back()
        .expect("a USER line in the runtime stage")
        .trim();
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    let uid: u32 = uid
        .parse()
        .unwrap_or_else(|_| panic!("USER {user} is not numeric"));
    let gid: u32 = gid
        .parse()
        .unwrap_or_else(|_| panic!("USER {user} is not numeric"));
    assert_ne!(uid, 0, "the image must not run as root");
    assert_eq!(option(stage, "--uid"), Some(uid), "useradd --uid");
    assert_eq!(option(stage, "--gid"), Some(gid), "groupadd/useradd --gid");

    let mut pods = 0;
    for entry in
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/base"))
            .expect("deploy/kubernetes/base")
    {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|ext| ext != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("manifest");
        for document in serde_yaml::Deserializer::from_str(&text) {
            let document = Value::deserialize(document).expect("YAML");
            let pod = &document["spec"]["template"]["spec"];
            let Some(containers) = pod["containers"].as_sequence() else {
                continue;
            };
            let runs_the_image = containers.iter().any(|container| {
                (container["image"].as_str()).is_some_and(|image| image.starts_with("slidegate"))
            });
            if !runs_the_image {
                continue;
            }
            pods += 1;
            let context = &pod["securityContext"];
            let name = path.display();
            assert_eq!(context["runAsNonRoot"].as_bool(), Some(true), "{name}");
            assert_eq!(
                context["runAsUser"].as_u64(),
                Some(u64::from(uid)),
                "{name}"
            );
            assert_eq!(
                context["runAsGroup"].as_u64(),
                Some(u64::from(gid)),
                "{name}"
            );
        }
    }
    assert!(pods > 0, "no pod in deploy/kubernetes/base runs the image");
}
