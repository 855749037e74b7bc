//! Report outputs: CSV, SVG line charts, an SVG map ([`map`]) and a
//! self-contained HTML page. Numbers are formatted with fixed precision so
//! that identical inputs give byte-identical files; axis ticks fall on
//! round values (1-2-5 steps).

pub mod map;

use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::Path;

/// One line on a chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub color: &'static str,
}

pub const PALETTE: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A line chart as an SVG document; `guide` draws a dashed horizontal line
/// (e.g. the watermark).
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    guide: Option<(f64, &str)>,
) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 340.0, 64.0, 170.0, 36.0, 44.0);
    // Non-finite points cannot be drawn (and would write "NaN" into the
    // path): they are left out.
    let finite = |&&(x, y): &&(f64, f64)| x.is_finite() && y.is_finite();
    let all = series.iter().flat_map(|s| s.points.iter()).filter(finite);
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if let Some((g, _)) = guide {
        y1 = y1.max(g);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // Round ticks: a 1-2-5 step (at least 1: the charts plot counts and
    // percentages), and the y axis ends on a tick. Negative values are not
    // charted here (the axis starts at 0).
    let y_step = nice_step(y1 / 4.0).max(1.0);
    let y1 = (y1 / y_step).ceil().max(1.0) * y_step;
    let x_step = nice_step((x1 - x0) / 5.0);
    let px = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| h - bottom - y / y1 * (h - top - bottom);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        svg,
        r#"<rect width="{w}" height="{h}" fill="white"/><text x="{left}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let _ = write!(
        svg,
        r##"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><line x1="{left}" y1="{top}" x2="{left}" y2="{:.1}" stroke="#333"/>"##,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for xv in ticks(x0, x1, x_step) {
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            px(xv),
            h - bottom + 16.0,
            tick(xv, x_step)
        );
    }
    for yv in ticks(0.0, y1, y_step) {
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/>"##,
            left - 6.0,
            py(yv) + 4.0,
            tick(yv, y_step),
            py(yv),
            w - right,
            py(yv)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        (left + w - right) / 2.0,
        h - 8.0,
        escape(x_label)
    );
    let _ = write!(
        svg,
        r#"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"#,
        h / 2.0,
        h / 2.0,
        escape(y_label)
    );
    if let Some((g, label)) = guide {
        let _ = write!(
            svg,
            r##"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" fill="#555">{}</text>"##,
            py(g),
            w - right,
            py(g),
            w - right + 6.0,
            py(g) + 4.0,
            escape(label)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let mut d = String::new();
        for (j, &(x, y)) in s.points.iter().filter(finite).enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if j == 0 { "M" } else { " L" },
                px(x),
                py(y)
            );
        }
        let _ = write!(
            svg,
            r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.6"/>"#,
            s.color
        );
        let ly = top + 14.0 + 18.0 * i as f64;
        let _ = write!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="3" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            w - right + 10.0,
            ly - 4.0,
            s.color,
            w - right + 26.0,
            ly,
            escape(&s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The smallest 1, 2 or 5 × 10^k at least `raw` (and > 0).
pub fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

/// The largest 1, 2 or 5 × 10^k at most `raw` (a scale bar that fits).
pub fn nice_step_below(raw: f64) -> f64 {
    let up = nice_step(raw);
    if up <= raw * (1.0 + 1e-9) {
        return up;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    [5.0, 2.0, 1.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&s| s <= raw * (1.0 + 1e-9))
        .unwrap_or(magnitude)
}

/// Multiples of `step` from the first at or after `from` to `to`.
fn ticks(from: f64, to: f64, step: f64) -> Vec<f64> {
    let first = (from / step - 1e-9).ceil() as i64;
    let last = (to / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// A tick label with as many decimals as the step needs.
fn tick(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

/// A self-contained HTML page from (heading, HTML body) sections.
pub fn html_page(title: &str, sections: &[(String, String)]) -> String {
    let mut html = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{0}</title>\
         <style>body{{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}\
         code{{background:#f4f4f4}}</style></head><body><h1>{0}</h1>\n",
        escape(title)
    );
    for (heading, body) in sections {
        let _ = writeln!(html, "<h2>{}</h2>\n{body}", escape(heading));
    }
    html.push_str("</body></html>\n");
    html
}

/// An HTML table from a header and rows.
pub fn html_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = String::from("<table><tr>");
    for h in header {
        let _ = write!(t, "<th>{}</th>", escape(h));
    }
    t.push_str("</tr>");
    for row in rows {
        t.push_str("<tr>");
        for cell in row {
            let _ = write!(t, "<td>{}</td>", escape(cell));
        }
        t.push_str("</tr>");
    }
    t.push_str("</table>\n");
    t
}

/// Lowercase hex sha256 of a file.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_one_two_or_five_times_a_power_of_ten() {
        for (raw, step) in [
            (0.3, 0.5),
            (1.0, 1.0),
            (1.2, 2.0),
            (26.25, 50.0),
            (80.75, 100.0),
            (161.0, 200.0),
            (323.0, 500.0),
            (4.9, 5.0),
        ] {
            assert_eq!(nice_step(raw), step, "{raw}");
        }
    }

    #[test]
    fn chart_ticks_are_round() {
        let chart = line_chart(
            "t",
            "s",
            "v",
            &[Series {
                name: "a".into(),
                points: vec![(0.0, 0.0), (41.0, 968.0)],
                color: PALETTE[0],
            }],
            None,
        );
        for label in [">0<", ">500<", ">1000<", ">10<", ">40<"] {
            assert!(chart.contains(label), "{label} in {chart}");
        }
        for odd in [">323<", ">645<", ">968<", ">26.25<"] {
            assert!(!chart.contains(odd), "{odd}");
        }
    }
}
