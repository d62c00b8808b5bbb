//! The Kubernetes manifests of `deploy/kubernetes/`, read as Kubernetes reads them: the
//! files a kustomization lists, the environment of a Deployment's container, and a
//! ConfigMap or Secret laid out on disk as the kubelet mounts it (each key a link
//! through `..data` to a timestamped directory, an update a swap of `..data`).

use std::path::{Path, PathBuf};

use yaml_serde::Value;

use crate::envoy::repo;

/// `deploy/kubernetes/<path>`.
pub fn manifest_path(path: &str) -> PathBuf {
    repo().join("deploy/kubernetes").join(path)
}

/// Every document of a YAML file.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.split("\n---\n")
        .map(|doc| yaml_serde::from_str(doc).unwrap_or_else(|e| panic!("{path:?}: {e}")))
        .collect()
}

/// The files a kustomization in `dir` brings in through `resources` and `components`,
/// followed into the directories they name, kustomization files included.
pub fn kustomized_files(dir: &Path) -> Vec<PathBuf> {
    let kustomization = dir.join("kustomization.yaml");
    let doc = &documents(&kustomization)[0];
    let mut files = vec![kustomization];
    for field in ["resources", "components"] {
        for entry in doc[field].as_sequence().into_iter().flatten() {
            let path = dir.join(entry.as_str().unwrap());
            if path.is_dir() {
                files.extend(kustomized_files(&path));
            } else {
                assert!(path.is_file(), "{path:?}, listed in {dir:?}, is missing");
                files.push(path);
            }
        }
    }
    files
}

/// The objects the kustomization in `dir` brings in, with the components `components`
/// (directories under `dir`, each a `kind: Component`) added to its own, as
/// `components:` in it would add them: the documents of every file
/// [`kustomized_files`] finds. Kustomize's transformers (namespace, images) are not
/// applied; the files are checked as they are written.
pub fn kustomized_objects(dir: &Path, components: &[&str]) -> Vec<Value> {
    let mut files = kustomized_files(dir);
    for component in components {
        let path = dir.join(component);
        let kustomization = &documents(&path.join("kustomization.yaml"))[0];
        assert_eq!(kustomization["kind"], "Component", "{path:?}");
        files.extend(kustomized_files(&path));
    }
    files
        .iter()
        .filter(|path| path.file_name().unwrap() != "kustomization.yaml")
        .flat_map(|path| documents(path))
        .collect()
}

/// The document of `kind` named `name` in `file`.
pub fn resource(file: &str, kind: &str, name: &str) -> Value {
    documents(&manifest_path(file))
        .into_iter()
        .find(|doc| doc["kind"] == kind && doc["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {file}"))
}

/// The first container of a Deployment.
pub fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

/// A container's `env` as (name, value) pairs (literal values only).
pub fn container_env(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|var| {
            let value = var["value"].as_str().expect("a literal value");
            (var["name"].as_str().unwrap().to_owned(), value.to_owned())
        })
        .collect()
}

/// The `data` (or `stringData`) of a ConfigMap or Secret, as (key, text) pairs.
pub fn data(resource: &Value) -> Vec<(String, String)> {
    let map = resource["data"]
        .as_mapping()
        .or_else(|| resource["stringData"].as_mapping())
        .expect("data or stringData");
    map.iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_owned(),
                v.as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A volume mounted as the kubelet mounts a ConfigMap or a Secret.
pub struct Volume {
    pub dir: PathBuf,
    version: u32,
}

impl Volume {
    /// Mounts `files` in `dir` (created): `dir/..<version>/<key>`, `dir/..data` a link
    /// to that directory and `dir/<key>` a link to `..data/<key>`.
    pub fn mount(dir: &Path, files: &[(String, String)]) -> Volume {
        std::fs::create_dir_all(dir).unwrap();
        let mut volume = Volume {
            dir: dir.to_owned(),
            version: 0,
        };
        volume.update(files);
        volume
    }

    /// An update as the kubelet's atomic writer makes it: the new version written in a
    /// new timestamped directory, `..data` swapped to it with one rename, the links of
    /// new keys made, those of removed keys and the old directory removed.
    pub fn update(&mut self, files: &[(String, String)]) {
        let old = self.version_dir();
        self.version += 1;
        let new = self.version_dir();
        std::fs::create_dir(self.dir.join(&new)).unwrap();
        for (key, text) in files {
            std::fs::write(self.dir.join(&new).join(key), text).unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&new, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            let kept = files.iter().any(|(key, _)| *key == name);
            if !name.starts_with("..") && !kept {
                std::fs::remove_file(self.dir.join(&name)).unwrap();
            }
        }
        for (key, _) in files {
            let link = self.dir.join(key);
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(format!("..data/{key}"), link).unwrap();
            }
        }
        if self.version > 1 {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }

    fn version_dir(&self) -> String {
        format!("..2026_01_01_00_00_00.{:09}", self.version)
    }
}
