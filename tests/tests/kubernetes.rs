//! The manifests of `deploy/kubernetes/`: every file a kustomization brings in is valid
//! for the Kubernetes API's schemas (kubernetes-validate, strict), the default is the
//! sidecar alone and the intake a component that adds it beside the sidecar, the
//! commands of docs/deploy.md name the images and components the manifests have, the
//! probes and ports name what the services serve, and the sidecar and the intake start
//! on their Deployment's own environment, with the rules ConfigMap and the keys Secret
//! laid out as the kubelet mounts them; a ConfigMap update (the `..data` link swapped)
//! is loaded without a restart, and so is a Secret update.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ratelimit_tests::envoy::repo;
use ratelimit_tests::intake::{Intake, batch, keygen};
use ratelimit_tests::kubernetes::{
    Volume, container, container_env, data, documents, kustomized_files, kustomized_objects,
    manifest_path, resource,
};
use ratelimit_tests::sidecar::{Options, Redis, Server, eventually, free_port, get_text, limit_of};
use yaml_serde::Value;

fn kubernetes_validate() -> String {
    let default = std::env::var("HOME").unwrap()
        + "/.cache/ratelimit-rs/kubernetes-validate-1.37.0/bin/kubernetes-validate";
    let path = std::env::var("KUBERNETES_VALIDATE").unwrap_or(default);
    assert!(
        Path::new(&path).exists(),
        "{path} is missing: scripts/test.sh installs kubernetes-validate from PyPI"
    );
    path
}

/// Every YAML file under `dir`.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files
}

#[test]
fn every_manifest_is_listed_and_valid_for_the_kubernetes_api() {
    let mut listed = kustomized_files(&manifest_path(""));
    listed.extend(kustomized_files(&manifest_path("intake")));
    listed.extend(kustomized_files(&manifest_path("servicemonitor")));
    let listed: BTreeSet<PathBuf> = listed.into_iter().collect();
    let present: BTreeSet<PathBuf> = yaml_files(&manifest_path("")).into_iter().collect();
    assert_eq!(
        listed, present,
        "files no kustomization brings in, or missing"
    );
    let resources: Vec<&PathBuf> = listed
        .iter()
        .filter(|p| p.file_name().unwrap() != "kustomization.yaml")
        .collect();
    let out = Command::new(kubernetes_validate())
        .args(["--strict", "--kubernetes-version", "1.33.0"])
        .args(&resources)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let passed = text.lines().filter(|l| l.contains(" passed for ")).count();
    assert_eq!(passed, 11, "{text}");
    // Only the Prometheus Operator's kind has no schema there: checked below instead.
    for line in text.lines().filter(|l| !l.contains(" passed for ")) {
        assert!(line.contains("kind ServiceMonitor"), "{line}");
    }
}

/// The objects of the sidecar, which the default kustomization creates.
const SIDECAR: [(&str, &str); 7] = [
    ("Namespace", "ratelimit"),
    ("ConfigMap", "ratelimit-rules"),
    ("Deployment", "ratelimit"),
    ("Service", "ratelimit"),
    ("PodDisruptionBudget", "ratelimit"),
    ("Deployment", "redis"),
    ("Service", "redis"),
];

/// The objects the `intake` component adds.
const INTAKE: [(&str, &str); 4] = [
    ("Secret", "operations-intake-api-keys"),
    ("Deployment", "operations-intake"),
    ("Service", "operations-intake"),
    ("PodDisruptionBudget", "operations-intake"),
];

/// The (kind, name) of each object.
fn kinds_and_names(objects: &[Value]) -> BTreeSet<(String, String)> {
    objects
        .iter()
        .map(|object| {
            let kind = object["kind"].as_str().unwrap().to_owned();
            (
                kind,
                object["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn owned(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    pairs
        .iter()
        .map(|(kind, name)| ((*kind).to_owned(), (*name).to_owned()))
        .collect()
}

/// The object of `kind` named `name` among `objects`.
fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_default_kustomization_is_the_sidecar_alone_and_the_rest_are_components() {
    let top = &documents(&manifest_path("kustomization.yaml"))[0];
    assert_eq!(top["kind"], "Kustomization");
    assert_eq!(top["namespace"], "ratelimit");
    assert!(
        top["components"].is_null(),
        "no component by default: {top:?}"
    );
    let objects = kustomized_objects(&manifest_path(""), &[]);
    assert_eq!(kinds_and_names(&objects), owned(&SIDECAR));
    for component in ["intake", "servicemonitor"] {
        let path = manifest_path(component).join("kustomization.yaml");
        let kustomization = &documents(&path)[0];
        assert_eq!(kustomization["kind"], "Component", "{path:?}");
        assert_eq!(
            kustomization["apiVersion"], "kustomize.config.k8s.io/v1alpha1",
            "{path:?}"
        );
    }
}

/// With `components: [intake]`, the intake is created beside the sidecar, and what its
/// Deployment names is there: the Secret it mounts, the sidecar's Service and gRPC port
/// it asks, the domain of the rules ConfigMap, its own Service's selector. (Each file is
/// checked against the API's schemas above.)
#[test]
fn the_intake_component_adds_the_intake_asking_the_sidecar() {
    let objects = kustomized_objects(&manifest_path(""), &["intake"]);
    let mut expected = owned(&SIDECAR);
    expected.extend(owned(&INTAKE));
    assert_eq!(kinds_and_names(&objects), expected);

    let deployment = object(&objects, "Deployment", "operations-intake");
    let env = container_env(container(deployment));
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    let keys = volumes.iter().find(|v| v["name"] == "api-keys").unwrap();
    object(
        &objects,
        "Secret",
        keys["secret"]["secretName"].as_str().unwrap(),
    );

    let url = env_value(&env, "RATELIMIT_GRPC_URL");
    let (host, port) = url
        .trim_start_matches("http://")
        .split_once(':')
        .unwrap_or_else(|| panic!("{url}: no port"));
    let port: u64 = port.parse().unwrap();
    let sidecar = object(&objects, "Service", host);
    let ports = sidecar["spec"]["ports"].as_sequence().unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "grpc" && p["port"].as_u64() == Some(port)),
        "{url}: not the gRPC port of the Service {host}"
    );
    let domain = env_value(&env, "RATELIMIT_DOMAIN");
    let rules = object(&objects, "ConfigMap", "ratelimit-rules");
    assert!(
        data(rules)
            .iter()
            .any(|(_, text)| text.contains(&format!("domain: {domain}\n"))),
        "no domain {domain} in the rules"
    );

    let service = object(&objects, "Service", "operations-intake");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_mapping().unwrap() {
        assert_eq!(&labels[key.as_str().unwrap()], value);
    }
    assert!(!env_value(&env, "KAFKA_BOOTSTRAP_SERVERS").is_empty());
}

/// The `kustomize edit` commands of docs/deploy.md set the images the Deployments name
/// and add a component that is one.
#[test]
fn the_documented_kustomize_commands_name_the_images_and_components() {
    let page = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    let words: Vec<&str> = page
        .split_whitespace()
        .map(|word| word.trim_end_matches(')'))
        .collect();
    let mut images = BTreeSet::new();
    let mut components = BTreeSet::new();
    for window in words.windows(5) {
        if window[..4] == ["kustomize", "edit", "set", "image"] {
            let name = window[4].split_once('=').unwrap().0;
            images.insert(name.to_owned());
        }
        if window[..4] == ["kustomize", "edit", "add", "component"] {
            components.insert(window[4].to_owned());
        }
    }
    let mut deployed = BTreeSet::new();
    for (file, name) in [
        ("ratelimit/deployment.yaml", "ratelimit"),
        ("intake/deployment.yaml", "operations-intake"),
    ] {
        let deployment = resource(file, "Deployment", name);
        let image = container(&deployment)["image"].as_str().unwrap().to_owned();
        deployed.insert(image.split_once(':').unwrap().0.to_owned());
    }
    assert_eq!(images, deployed, "kustomize edit set image NAME=...");
    assert_eq!(
        components,
        BTreeSet::from(["intake".to_owned()]),
        "kustomize edit add component"
    );
    for component in &components {
        // A directory beside the default kustomization, of kind Component.
        kustomized_objects(&manifest_path(""), &[component.as_str()]);
    }
}

/// The Service selecting a ServiceMonitor's labels has a port of each endpoint's name.
#[test]
fn each_service_monitor_scrapes_a_named_port_of_its_service() {
    let monitors = documents(&manifest_path("servicemonitor/servicemonitors.yaml"));
    assert_eq!(monitors.len(), 2);
    for monitor in monitors {
        let name = monitor["metadata"]["name"].as_str().unwrap();
        let file = match name {
            "ratelimit" => "ratelimit/service.yaml",
            _ => "intake/service.yaml",
        };
        let service = resource(file, "Service", name);
        let labels = &service["metadata"]["labels"];
        for (key, value) in monitor["spec"]["selector"]["matchLabels"]
            .as_mapping()
            .unwrap()
        {
            assert_eq!(&labels[key.as_str().unwrap()], value, "{name}");
        }
        let ports = service["spec"]["ports"].as_sequence().unwrap();
        for endpoint in monitor["spec"]["endpoints"].as_sequence().unwrap() {
            assert!(
                ports.iter().any(|p| p["name"] == endpoint["port"]),
                "{name}: {endpoint:?}"
            );
        }
    }
}

/// The value of `name` in a container's environment.
fn env_value(env: &[(String, String)], name: &str) -> String {
    env.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("{name} is not set"))
        .1
        .clone()
}

/// The seconds of a duration written `10s`.
fn seconds(text: &str) -> u64 {
    text.strip_suffix('s').unwrap().parse().unwrap()
}

#[test]
fn the_grace_periods_outlast_the_drains_and_the_ports_are_the_served_ones() {
    for (file, name, drain, http) in [
        (
            "ratelimit/deployment.yaml",
            "ratelimit",
            "SHUTDOWN_DRAIN_TIMEOUT",
            8080,
        ),
        (
            "intake/deployment.yaml",
            "operations-intake",
            "SHUTDOWN_TIMEOUT",
            3000,
        ),
    ] {
        let deployment = resource(file, "Deployment", name);
        let env = container_env(container(&deployment));
        let grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap();
        assert!(grace > seconds(&env_value(&env, drain)), "{name}");
        let ports = container(&deployment)["ports"].as_sequence().unwrap();
        let port = |name: &str| {
            ports.iter().find(|p| p["name"] == name).unwrap()["containerPort"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(port("http"), http, "{name}");
        if name == "ratelimit" {
            let metrics = env_value(&env, "PROMETHEUS_ADDR");
            assert_eq!(metrics, format!(":{}", port("metrics")));
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                assert_eq!(
                    container(&deployment)[probe]["httpGet"]["path"],
                    "/healthcheck"
                );
            }
        }
    }
}

/// Where a container's volume `name` is mounted.
fn mount_path(container: &Value, name: &str) -> String {
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let mount = mounts.iter().find(|m| m["name"] == name).unwrap();
    mount["mountPath"].as_str().unwrap().to_owned()
}

/// The Deployment's environment with its addresses replaced by the test's: the settings
/// in `replace` win, the others are kept as written.
fn options_from(
    env: Vec<(String, String)>,
    replace: &[(&str, String)],
) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = env
        .into_iter()
        .filter(|(k, _)| !replace.iter().any(|(r, _)| r == k))
        .map(|(k, v)| (&*Box::leak(k.into_boxed_str()), v))
        .collect();
    for (key, value) in replace {
        out.push((Box::leak((*key).to_owned().into_boxed_str()), value.clone()));
    }
    out
}

/// The sidecar on its Deployment's environment, the rules ConfigMap mounted under `root`
/// where the Deployment mounts it, and a real Redis.
fn sidecar_as_deployed(root: &Path, redis: &Redis) -> (Server, Volume) {
    let deployment = resource("ratelimit/deployment.yaml", "Deployment", "ratelimit");
    let container = container(&deployment);
    let rules = resource("ratelimit/rules.yaml", "ConfigMap", "ratelimit-rules");
    let under_root = |path: &str| root.join(path.trim_start_matches('/'));
    let volume = Volume::mount(&under_root(&mount_path(container, "rules")), &data(&rules));
    let env = container_env(container);
    let runtime_root = under_root(&env_value(&env, "RUNTIME_ROOT"));
    let env = options_from(
        env,
        &[
            ("RUNTIME_ROOT", runtime_root.display().to_string()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", free_port())),
        ],
    );
    let server = Server::start_with(Options {
        env,
        ..Options::default()
    });
    (server, volume)
}

#[tokio::test]
async fn the_sidecar_runs_as_deployed_and_loads_a_config_map_update_in_place() {
    let root = tempfile::tempdir().unwrap();
    let redis = Redis::start(&[]);
    let (server, mut volume) = sidecar_as_deployed(root.path(), &redis);
    assert_eq!(
        limit_of(&server, "edge", &[("user", "alice")]).await,
        Some(600)
    );
    assert_eq!(
        limit_of(&server, "operations", &[("client_id", "acme")]).await,
        Some(1000)
    );
    assert!(!redis.keys().is_empty(), "the counters are in Redis");
    let edge = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    volume.update(&[("edge.yaml".to_owned(), edge.to_owned())]);
    let reloaded = eventually(Duration::from_secs(10), || async {
        limit_of(&server, "edge", &[("user", "alice")]).await == Some(1)
    })
    .await;
    assert!(reloaded, "the swap was not loaded:\n{}", server.log());
    // The key removed from the ConfigMap took its domain with it.
    assert_eq!(
        limit_of(&server, "operations", &[("client_id", "acme")]).await,
        None
    );
    let stats = get_text(&server.debug_url("/stats")).await;
    assert!(
        stats.contains("ratelimit.service.config_load_success: 2"),
        "{stats}"
    );
}

#[tokio::test]
async fn the_intake_runs_as_deployed_asking_the_sidecar_and_follows_its_secret() {
    let root = tempfile::tempdir().unwrap();
    let redis = Redis::start(&[]);
    let (sidecar, _rules) = sidecar_as_deployed(root.path(), &redis);
    let deployment = resource("intake/deployment.yaml", "Deployment", "operations-intake");
    let container = container(&deployment);
    let secret = resource(
        "intake/api-keys.yaml",
        "Secret",
        "operations-intake-api-keys",
    );
    let keys_dir = root.path().join("keys");
    let mut keys = Volume::mount(&keys_dir, &data(&secret));
    let env = container_env(container);
    let keys_file = env_value(&env, "API_KEYS_FILE");
    let mounted = Path::new(&keys_file)
        .strip_prefix(mount_path(container, "api-keys"))
        .unwrap();
    // The broker is the only part not deployed here: librdkafka's mock stands in for it.
    let env = options_from(
        env,
        &[
            (
                "API_KEYS_FILE",
                keys_dir.join(mounted).display().to_string(),
            ),
            (
                "RATELIMIT_GRPC_URL",
                format!("http://127.0.0.1:{}", sidecar.grpc),
            ),
            ("KAFKA_MOCK_BROKER", "true".to_owned()),
        ],
    );
    // The intake's launcher picks the port (the manifest's is the default, 3000).
    let env: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| *k != "PORT")
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    let intake = Intake::start(&env);
    let (key, entry) = keygen("acme", None);
    let post = || async {
        let answer = reqwest::Client::new()
            .post(intake.url("/operations"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(batch("sell", 150))
            .send()
            .await
            .unwrap();
        answer.status().as_u16()
    };
    assert_eq!(post().await, 401, "a key the Secret does not list");
    let listed = data(&secret)[0].1.clone() + &entry;
    keys.update(&[("api-keys.yaml".to_owned(), listed)]);
    // Within the watcher's delay, the new key is known: its first batch is accepted.
    let mut status = post().await;
    for _ in 0..200 {
        if status != 401 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = post().await;
    }
    assert_eq!(status, 202, "the Secret's update:\n{}", intake.log());
    // The sidecar's `operations` rules: 200 sold operations a minute, so 150 more are
    // too many.
    assert_eq!(post().await, 429, "{}", intake.log());
}
