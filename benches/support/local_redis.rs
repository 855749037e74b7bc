//! A redis-server for benches, on a free loopback port (`None` when
//! redis-server is not installed, so the bench can skip its Redis parts).

/// A redis-server for the bench, on a free loopback port.
pub struct LocalRedis {
    pub port: u16,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl LocalRedis {
    pub fn start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let dir = tempfile::tempdir().ok()?;
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(Self {
                    port,
                    child,
                    _dir: dir,
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }

    pub fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `(calls, total µs)` of the rules script so far.
    pub fn script_stats(&self) -> (f64, f64) {
        let info = self.cli(&["INFO", "commandstats"]);
        let field = |line: &str, name: &str| {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .fold((0.0, 0.0), |(calls, usec), l| {
                let l = l.split_once(':').map_or(l, |(_, v)| v);
                (calls + field(l, "calls"), usec + field(l, "usec"))
            })
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
