//! A real headless Chromium (Debian's `chromium`) looking at a report:
//! what it printed to its console, and a screenshot to count colours in.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// What the browser saw.
pub struct PageCheck {
    /// Console lines (`CONSOLE` in Chromium's log): any at all is a defect
    /// for a static report.
    pub console: Vec<String>,
    pub width: u32,
    pub height: u32,
    /// RGBA pixels of the screenshot.
    pub pixels: Vec<u8>,
}

impl PageCheck {
    /// Pixels within ±3 per channel of `#rrggbb`.
    pub fn count_colour(&self, hex: &str) -> usize {
        let c = |i: usize| u8::from_str_radix(&hex[1 + 2 * i..3 + 2 * i], 16).unwrap_or(0);
        let (r, g, b) = (c(0), c(1), c(2));
        self.pixels
            .chunks_exact(4)
            .filter(|p| p[0].abs_diff(r) <= 3 && p[1].abs_diff(g) <= 3 && p[2].abs_diff(b) <= 3)
            .count()
    }
}

/// Loads `page` in headless Chromium and screenshots it at `width` ×
/// `height`, or returns `None` (skipping loudly) without Chromium.
pub fn check_page(page: &Path, width: u32, height: u32) -> Option<PageCheck> {
    let chromium = super::require(
        "chromium (apt-get install chromium)",
        super::binary("chromium"),
    )?;
    let profile = tempfile::tempdir().expect("profile dir");
    let shot = profile.path().join("shot.png");
    let url = format!("file://{}", page.canonicalize().expect("page").display());
    // Bounded: a browser that hangs fails the test instead of stalling CI.
    let out = Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(&url)
        .output()
        .expect("run chromium");
    let log = String::from_utf8_lossy(&out.stderr);
    let console = log
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect();
    let decoder = png::Decoder::new(
        std::fs::File::open(&shot)
            .unwrap_or_else(|e| panic!("chromium wrote no screenshot ({e}):\n{log}")),
    );
    let mut reader = decoder.read_info().expect("png header");
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).expect("png frame");
    pixels.truncate(info.buffer_size());
    let pixels = match info.color_type {
        png::ColorType::Rgba => pixels,
        png::ColorType::Rgb => pixels
            .chunks_exact(3)
            .flat_map(|p| [p[0], p[1], p[2], 255])
            .collect(),
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    Some(PageCheck {
        console,
        width: info.width,
        height: info.height,
        pixels,
    })
}
