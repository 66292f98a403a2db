//! Which directories to watch so that a rule path is followed as the user means it.
//!
//! A path like `/etc/slidegate/current/rules.yaml` names different files over time: deploy tools
//! swap the `current` symlink to a new release, Kubernetes swaps `..data` in a ConfigMap volume,
//! an operator deletes the directory and creates it again, a rule file is a symlink to a file
//! elsewhere. A watch on what the path resolved to at start misses all of these.
//!
//! So the path is resolved here step by step, as the kernel does, and every directory in which a
//! step looks up a name is watched, for that name only: the directories along the path, those
//! along each symlink's target, the rule directory itself (every entry), and the path of each
//! symlink in the rule directory. An event on any of these names means the path may now name
//! something else: the caller resolves it again ([`plan`]) and moves its watches to the new
//! [`Plan`]. Events for other names in those directories (a busy `/tmp`) are ignored.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed in one resolution before giving up, as Linux's `ELOOP` limit.
const MAX_LINKS: usize = 40;

/// The directories to watch, each with the entries that matter in it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    dirs: HashMap<PathBuf, Watch>,
}

/// One watched directory.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Watch {
    /// Device and inode when planned: a directory deleted and created again under the same name
    /// is another directory, whose watch must be set again.
    identity: Option<(u64, u64)>,
    names: Names,
}

/// The entries of a watched directory that matter.
#[derive(Debug, PartialEq, Eq)]
enum Names {
    /// Every entry (the rule directory).
    All,
    Only(HashSet<OsString>),
}

impl Default for Names {
    fn default() -> Self {
        Names::Only(HashSet::new())
    }
}

impl Plan {
    /// The watched directories with their identities.
    pub(super) fn dirs(&self) -> impl Iterator<Item = (&Path, Option<(u64, u64)>)> {
        self.dirs.iter().map(|(dir, w)| (dir.as_path(), w.identity))
    }

    /// Whether an event on `path` can change what the rule path names or holds.
    pub(super) fn covers(&self, path: &Path) -> bool {
        if self.dirs.contains_key(path) {
            return true;
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return false;
        };
        self.dirs.get(parent).is_some_and(|w| match &w.names {
            Names::All => true,
            Names::Only(names) => names.contains(name),
        })
    }

    /// Forgets the identity of `dir` if it is watched: an event on the directory itself (deleted,
    /// moved, replaced) may have ended its watch, and a directory created in its place can get
    /// the same inode number, so only this makes the next [`plan`] differ and watch it again.
    pub(super) fn forget(&mut self, dir: &Path) {
        if let Some(watch) = self.dirs.get_mut(dir) {
            watch.identity = None;
        }
    }

    fn add_name(&mut self, dir: &Path, name: &OsString) {
        if let Names::Only(names) = &mut self.dirs.entry(dir.to_owned()).or_default().names {
            names.insert(name.clone());
        }
    }

    fn add_all(&mut self, dir: &Path) {
        self.dirs.entry(dir.to_owned()).or_default().names = Names::All;
    }
}

/// Resolves `path` (absolute) and returns what to watch for it.
pub(super) fn plan(path: &Path) -> Plan {
    let mut plan = Plan::default();
    if let Some(resolved) = resolve(&mut plan, path)
        && resolved.is_dir()
    {
        plan.add_all(&resolved);
        // Rule files that are symlinks (Kubernetes mounts each ConfigMap key as one): their
        // targets may change without any event in the rule directory.
        if let Ok(entries) = std::fs::read_dir(&resolved) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_symlink()) {
                    resolve(&mut plan, &entry.path());
                }
            }
        }
    }
    for (dir, watch) in &mut plan.dirs {
        watch.identity = std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()));
    }
    plan
}

/// One step of a resolution still to take.
enum Step {
    Parent,
    Name(OsString),
}

/// Pushes `path`'s steps so that the first one is popped first.
fn push_steps(pending: &mut Vec<Step>, path: &Path) {
    for component in path.components().rev() {
        match component {
            Component::Normal(name) => pending.push(Step::Name(name.to_owned())),
            Component::ParentDir => pending.push(Step::Parent),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}

/// Walks `path` from `/` one name at a time, following symlinks, and adds every lookup to
/// `plan`. Returns the physical path reached, or `None` where a step names nothing (yet): the
/// watch on the directory of that step sees it appear.
fn resolve(plan: &mut Plan, path: &Path) -> Option<PathBuf> {
    let mut pending = Vec::new();
    push_steps(&mut pending, path);
    let mut current = PathBuf::from("/");
    let mut links = 0;
    while let Some(step) = pending.pop() {
        let name = match step {
            Step::Parent => {
                current.pop();
                continue;
            }
            Step::Name(name) => name,
        };
        plan.add_name(&current, &name);
        let next = current.join(&name);
        let metadata = std::fs::symlink_metadata(&next).ok()?;
        if !metadata.is_symlink() {
            current = next;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return None;
        }
        let target = std::fs::read_link(&next).ok()?;
        if target.is_absolute() {
            current = PathBuf::from("/");
        }
        push_steps(&mut pending, &target);
    }
    Some(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn follows_symlinks_along_the_path_and_in_the_rule_directory() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = root.path().canonicalize().expect("canonical");
        std::fs::create_dir_all(base.join("releases/1")).expect("mkdir");
        std::fs::create_dir_all(base.join("elsewhere")).expect("mkdir");
        std::fs::write(base.join("elsewhere/real.yaml"), "x").expect("write");
        symlink("releases/1", base.join("current")).expect("symlink");
        symlink(
            base.join("elsewhere/real.yaml"),
            base.join("releases/1/a.yaml"),
        )
        .expect("symlink");

        let plan = plan(&base.join("current"));
        // The name `current` in the base directory, and `1` in releases/.
        assert!(plan.covers(&base.join("current")));
        assert!(!plan.covers(&base.join("unrelated")));
        assert!(plan.covers(&base.join("releases/1")));
        assert!(!plan.covers(&base.join("releases/2")));
        // Every entry of the rule directory.
        assert!(plan.covers(&base.join("releases/1/new.yaml")));
        // The symlinked rule file's target, and only it, in its directory.
        assert!(plan.covers(&base.join("elsewhere/real.yaml")));
        assert!(!plan.covers(&base.join("elsewhere/other.yaml")));
        // Every ancestor, for the next name on the path only.
        let parent = base.parent().expect("parent");
        assert!(plan.covers(&base));
        assert!(!plan.covers(&parent.join("slidegate-unrelated")));
    }

    #[test]
    fn a_missing_path_is_watched_where_it_would_appear() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = root.path().canonicalize().expect("canonical");
        let plan = plan(&base.join("gone/rules.yaml"));
        assert!(plan.covers(&base.join("gone")));
        assert!(!plan.covers(&base.join("gone/rules.yaml")));
    }

    #[test]
    fn symlink_loops_end() {
        let root = tempfile::tempdir().expect("tempdir");
        let base = root.path().canonicalize().expect("canonical");
        symlink("b", base.join("a")).expect("symlink");
        symlink("a", base.join("b")).expect("symlink");
        let plan = plan(&base.join("a"));
        assert!(plan.covers(&base.join("a")) && plan.covers(&base.join("b")));
    }
}
