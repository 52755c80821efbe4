//! A timeline picture of a crawl, as SVG: one row per host, one bar per
//! request coloured by replica, penalties (`Retry-After`) marked.

use std::fmt::Write as _;

/// One request on the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bar {
    /// The host (its row).
    pub host: String,
    /// The replica that sent it (its colour).
    pub replica: usize,
    /// When it was sent, in milliseconds on any common clock.
    pub start_ms: u64,
    /// When its body had been read.
    pub end_ms: u64,
    /// Its status, if it got a response.
    pub status: Option<u16>,
    /// The hold its `Retry-After` asked for, drawn after its end.
    pub penalty_ms: Option<u64>,
}

const PALETTE: [&str; 6] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
];
const LEFT: f64 = 140.0;
const WIDTH: f64 = 860.0;
const ROW: f64 = 36.0;
const TOP: f64 = 64.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The SVG document for `bars`, headed by `title`. Hosts appear in the
/// order they are first seen.
pub fn svg(bars: &[Bar], title: &str) -> String {
    let mut hosts: Vec<&str> = Vec::new();
    for bar in bars {
        if !hosts.contains(&bar.host.as_str()) {
            hosts.push(&bar.host);
        }
    }
    let t0 = bars.iter().map(|b| b.start_ms).min().unwrap_or(0);
    let t1 = bars
        .iter()
        .map(|b| b.end_ms + b.penalty_ms.unwrap_or(0))
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let span = (t1 - t0) as f64;
    let x = |ms: u64| LEFT + (ms.saturating_sub(t0)) as f64 / span * WIDTH;
    let replicas = bars.iter().map(|b| b.replica + 1).max().unwrap_or(0);
    let height = TOP + hosts.len() as f64 * ROW + 40.0;
    let total = LEFT + WIDTH + 30.0;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{total:.0}" height="{height:.0}" viewBox="0 0 {total:.0} {height:.0}" font-family="sans-serif" font-size="12">"##
    );
    out.push_str(
        r##"<defs><pattern id="hold" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" height="6" fill="#e15759" fill-opacity="0.45"/></pattern></defs>"##,
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        out,
        r##"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"##,
        escape(title)
    );

    // Legend: one swatch per replica, then the penalty pattern.
    let mut lx = LEFT;
    for r in 0..replicas {
        let _ = writeln!(
            out,
            r##"<rect x="{lx:.1}" y="34" width="14" height="12" fill="{}"/><text x="{:.1}" y="44">replica {}</text>"##,
            PALETTE[r % PALETTE.len()],
            lx + 18.0,
            r + 1
        );
        lx += 90.0;
    }
    let _ = writeln!(
        out,
        r##"<rect x="{lx:.1}" y="34" width="14" height="12" fill="url(#hold)" stroke="#e15759"/><text x="{:.1}" y="44">held back (Retry-After)</text>"##,
        lx + 18.0
    );

    // Time axis: a tick every 250 ms, 500 ms, 1 s, ... whichever gives about ten.
    let step = [250u64, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000]
        .into_iter()
        .find(|s| span / *s as f64 <= 12.0)
        .unwrap_or(60_000);
    let axis_y = TOP + hosts.len() as f64 * ROW + 6.0;
    let mut tick = 0;
    while tick <= t1 - t0 {
        let tx = x(t0 + tick);
        let _ = writeln!(
            out,
            r##"<line x1="{tx:.1}" y1="{TOP}" x2="{tx:.1}" y2="{axis_y:.1}" stroke="#dddddd"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#555555">{:.2} s</text>"##,
            axis_y + 16.0,
            tick as f64 / 1000.0
        );
        tick += step;
    }

    for (row, host) in hosts.iter().enumerate() {
        let y = TOP + row as f64 * ROW;
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT - 10.0,
            y + ROW / 2.0 + 4.0,
            escape(host)
        );
        for bar in bars.iter().filter(|b| b.host == *host) {
            let (bx, bw) = (x(bar.start_ms), (x(bar.end_ms) - x(bar.start_ms)).max(2.0));
            let stroke = if bar.status.is_some_and(|s| s >= 400) || bar.status.is_none() {
                r##" stroke="#e15759" stroke-width="2""##
            } else {
                ""
            };
            let label = match bar.status {
                Some(status) => status.to_string(),
                None => "error".to_owned(),
            };
            let _ = writeln!(
                out,
                r##"<rect x="{bx:.1}" y="{:.1}" width="{bw:.1}" height="20" rx="2" fill="{}"{stroke}><title>{} replica {} {label} {} ms</title></rect>"##,
                y + 8.0,
                PALETTE[bar.replica % PALETTE.len()],
                escape(host),
                bar.replica + 1,
                bar.end_ms - bar.start_ms
            );
            if let Some(hold) = bar.penalty_ms {
                let (px, pw) = (
                    x(bar.end_ms),
                    (x(bar.end_ms + hold) - x(bar.end_ms)).max(2.0),
                );
                let _ = writeln!(
                    out,
                    r##"<rect x="{px:.1}" y="{:.1}" width="{pw:.1}" height="28" fill="url(#hold)" stroke="#e15759" stroke-dasharray="3,2"><title>Retry-After: {} ms</title></rect><text x="{:.1}" y="{:.1}" fill="#e15759">Retry-After {:.1} s</text>"##,
                    y + 4.0,
                    hold,
                    px + 4.0,
                    y + 2.0,
                    hold as f64 / 1000.0
                );
            }
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(host: &str, replica: usize, start_ms: u64, end_ms: u64) -> Bar {
        Bar {
            host: host.into(),
            replica,
            start_ms,
            end_ms,
            status: Some(200),
            penalty_ms: None,
        }
    }

    #[test]
    fn one_row_per_host_one_bar_per_request_and_penalties_marked() {
        let mut penalized = bar("busy.test", 2, 100, 150);
        penalized.status = Some(429);
        penalized.penalty_ms = Some(1000);
        let bars = [
            bar("a.test", 0, 0, 50),
            bar("a.test", 1, 300, 400),
            bar("<b>", 0, 10, 20),
            penalized,
        ];
        let doc = svg(&bars, "demo & test");
        assert!(doc.starts_with("<svg"));
        assert!(doc.trim_end().ends_with("</svg>"));
        assert_eq!(
            doc.matches("<title>").count(),
            5,
            "four bars and one penalty"
        );
        assert_eq!(doc.matches("Retry-After 1.0 s").count(), 1);
        assert!(doc.contains("&lt;b&gt;") && doc.contains("demo &amp; test"));
        assert!(doc.contains("replica 3"), "the legend names every replica");
        // Hosts keep their first-seen order.
        assert!(doc.find(">a.test<").unwrap() < doc.find(">busy.test<").unwrap());
    }

    #[test]
    fn an_empty_timeline_is_still_a_picture() {
        let doc = svg(&[], "nothing");
        assert!(doc.contains("nothing") && doc.trim_end().ends_with("</svg>"));
    }
}
