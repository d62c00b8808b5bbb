//! The container images of `deploy/image/`, built with podman from the workspace's
//! binaries and run from their exported root filesystem under `chroot`, with the
//! image's user, entrypoint and environment (`podman run` needs cgroups that the test
//! machines do not give a container).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::calls::run_ok;
use crate::envoy::repo;

/// Panics, naming the package that provides it, when `command` is not installed: the
/// tests that need it must fail where it is missing, never pass by skipping.
pub fn require_tool(command: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {command}")])
        .output()
        .is_ok_and(|out| out.status.success());
    assert!(
        found,
        "{command} is not installed: scripts/test.sh installs it (apt-get install {package})"
    );
}

/// An image built by `deploy/image/build.sh`, removed when dropped.
pub struct Image {
    pub tag: String,
}

/// The address the tests give the `org.opencontainers.image.source` label.
pub const TEST_SOURCE: &str = "https://example.test/ratelimit-rs";

impl Image {
    /// Builds the image `name` (`ratelimit` or `operations-intake`) from the binaries
    /// the tests run (next to the test executable: the debug build, stripped by the
    /// script), under a tag of this process's own, with [`TEST_SOURCE`] for its source.
    pub fn build(name: &str) -> Image {
        Image::build_with_source(name, Some(TEST_SOURCE))
    }

    /// Builds as [`Image::build`] does, with `IMAGE_SOURCE` set to `source`; with
    /// `None`, as in a checkout with no git remote: `IMAGE_SOURCE` unset and no
    /// repository to read a remote from (`GIT_DIR` an empty directory).
    pub fn build_with_source(name: &str, source: Option<&str>) -> Image {
        require_tool("podman", "podman");
        let bin_dir = crate::binary(name).parent().unwrap().to_owned();
        let tag = format!("localhost/{name}-test:{}", std::process::id());
        let no_repository = tempfile::tempdir().unwrap();
        let mut command = Command::new(repo().join("deploy/image/build.sh"));
        command
            .args([name, &tag])
            .env("BIN_DIR", &bin_dir)
            .env("CONTAINER_TOOL", "podman");
        match source {
            Some(source) => {
                command.env("IMAGE_SOURCE", source);
            }
            None => {
                command
                    .env_remove("IMAGE_SOURCE")
                    .env("GIT_DIR", no_repository.path());
            }
        }
        run_ok(&mut command);
        Image { tag }
    }

    /// The image's configuration (`User`, `Env`, `Entrypoint`, `ExposedPorts`,
    /// `Labels`), as `podman image inspect` reports it.
    pub fn config(&self) -> Value {
        let out = run_ok(Command::new("podman").args(["image", "inspect", &self.tag]));
        let mut all: Value = serde_json::from_str(&out).unwrap();
        all[0]["Config"].take()
    }

    /// The image's size in bytes.
    pub fn size(&self) -> u64 {
        let out = run_ok(Command::new("podman").args([
            "image",
            "inspect",
            "--format",
            "{{.Size}}",
            &self.tag,
        ]));
        out.trim().parse().unwrap()
    }

    /// The image's root filesystem, exported from a container made of it
    /// (`podman create` + `podman export`) and unpacked in a new directory.
    pub fn export(&self) -> tempfile::TempDir {
        let id = run_ok(Command::new("podman").args(["create", &self.tag]));
        let id = id.trim();
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("rootfs.tar");
        let exported = Command::new("podman")
            .args(["export", "-o"])
            .arg(&tar)
            .arg(id)
            .status();
        let _ = Command::new("podman").args(["rm", "-f", id]).output();
        assert!(exported.unwrap().success(), "podman export {id}");
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir(&rootfs).unwrap();
        run_ok(
            Command::new("tar")
                .arg("-xf")
                .arg(&tar)
                .arg("-C")
                .arg(&rootfs),
        );
        std::fs::remove_file(&tar).unwrap();
        dir
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rmi", "-f", &self.tag])
            .output();
    }
}

/// The unpacked root filesystem of an [`Image::export`].
pub fn rootfs(export: &tempfile::TempDir) -> PathBuf {
    export.path().join("rootfs")
}

/// A command that runs `program` (the image's entrypoint when `None`) with `args` in
/// `rootfs` under `chroot`, as the image's user and with only the image's environment
/// plus `env`, as a container runtime would start it.
pub fn in_image(
    config: &Value,
    rootfs: &Path,
    program: Option<&str>,
    args: &[&str],
    env: &[(&str, String)],
) -> Command {
    let user = config["User"].as_str().expect("the image names its user");
    let mut command = Command::new("chroot");
    command.arg(format!("--userspec={user}")).arg(rootfs);
    match program {
        Some(program) => command.arg(program),
        None => command.args(strings(&config["Entrypoint"])),
    };
    command.args(args).env_clear();
    for pair in strings(&config["Env"]) {
        let (key, value) = pair.split_once('=').unwrap();
        command.env(key, value);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// The strings of a JSON array.
pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|item| item.as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A process started by [`spawn`], killed when dropped.
pub struct Process {
    child: std::process::Child,
    /// Its standard error.
    pub log: PathBuf,
}

/// Starts `command` with its standard error in `log`.
pub fn spawn(mut command: Command, log: PathBuf) -> Process {
    let child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("chroot starts");
    Process { child, log }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
