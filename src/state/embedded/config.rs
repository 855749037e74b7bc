//! The embedded backend's keys of `[state]`: their defaults and checks.

use crate::problems::Problems;
use crate::state::config::EmbeddedConfig;
use std::path::Path;

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            path: "geogate-state.sqlite".into(),
        }
    }
}

impl EmbeddedConfig {
    /// The `[state]` keys this backend reads, besides `backend` and `fsync`.
    pub const KEYS: &[&str] = &["path"];

    pub fn check(&self, events: Option<&Path>, dead_letter: &Path, problems: &mut Problems) {
        let path = &self.path;
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if path.as_os_str().is_empty() {
            problems.add("state.path", "must name a file for the embedded store");
        } else if path.is_dir() {
            problems.add(
                "state.path",
                format!("{} is a directory; name a file in it", path.display()),
            );
        } else if let Some(dir) = parent
            && !dir.is_dir()
        {
            problems.add(
                "state.path",
                format!("directory {} does not exist", dir.display()),
            );
        } else if Some(path.as_path()) == events || path == dead_letter {
            problems.add(
                "state.path",
                format!(
                    "{} is also the events or dead-letter file; the state needs a file of its own",
                    path.display()
                ),
            );
        }
    }
}
