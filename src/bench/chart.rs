//! The speedup chart: one group of bars per category (and overall), one bar per speculative
//! mode, a dashed line at 1.0x. Plain SVG written by hand: no plotting dependency to build.
//!
//! Why it exists: a table of 13 categories × modes is hard to read at a glance; the chart
//! shows where speculation pays and where it does not.

use std::fmt::Write;

use super::report::SummaryRow;

const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The SVG document for the rows' median speedups (rows without a speedup are skipped).
pub fn speedup_svg(rows: &[SummaryRow], title: &str) -> String {
    let (modes, categories) = modes_and_categories(rows);
    let top = rows
        .iter()
        .filter_map(|r| r.speedup.map(|s| s.median))
        .fold(1.5f64, f64::max)
        * 1.1;
    let at = Layout::new(modes.len(), categories.len(), title, top);
    let (left, width, height) = (at.left, at.width, at.height);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="24" font-size="14" text-anchor="middle">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    write_gridlines(&mut svg, &at);
    write_bars(&mut svg, &at, rows, &modes, &categories);
    let _ = writeln!(
        svg,
        r#"<line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black" stroke-dasharray="5,4"/>"#,
        left + at.plot_w,
        at.y(1.0),
        at.y(1.0)
    );
    let _ = writeln!(
        svg,
        r#"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">speedup vs plain</text>"#,
        at.top_pad + at.plot_h / 2.0,
        at.top_pad + at.plot_h / 2.0
    );
    write_legend(&mut svg, &at, &modes);
    svg.push_str("</svg>\n");
    svg
}

/// The modes and the categories that have a speedup, in the rows' order.
fn modes_and_categories(rows: &[SummaryRow]) -> (Vec<&str>, Vec<&str>) {
    let mut modes: Vec<&str> = Vec::new();
    let mut categories: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.speedup.is_some()) {
        if !modes.contains(&r.mode.as_str()) {
            modes.push(&r.mode);
        }
        if !categories.contains(&r.category.as_str()) {
            categories.push(&r.category);
        }
    }
    (modes, categories)
}

/// Where things go: margins, bar and group widths, the plot's size and the document's.
struct Layout {
    left: f64,
    top_pad: f64,
    bottom: f64,
    bar_w: f64,
    group_w: f64,
    plot_w: f64,
    plot_h: f64,
    /// The speedup at the plot's top edge.
    top: f64,
    width: f64,
    height: f64,
}

impl Layout {
    fn new(modes: usize, categories: usize, title: &str, top: f64) -> Layout {
        let (left, right, top_pad, bottom) = (60.0, 20.0, 50.0, 90.0);
        let bar_w = 14.0;
        let group_w = (modes.max(1) as f64) * bar_w + 16.0;
        let plot_w = group_w * categories.max(1) as f64;
        let plot_h = 300.0;
        // Wide enough for the title at ~7 px a character.
        let width = (left + plot_w + right).max(title.chars().count() as f64 * 7.0 + 40.0);
        let legend_h = 18.0 * modes as f64;
        let height = top_pad + plot_h + bottom + legend_h;
        Layout {
            left,
            top_pad,
            bottom,
            bar_w,
            group_w,
            plot_w,
            plot_h,
            top,
            width,
            height,
        }
    }

    /// The height in the document of speedup `v`.
    fn y(&self, v: f64) -> f64 {
        self.top_pad + self.plot_h * (1.0 - v / self.top)
    }
}

/// Axis with gridlines every 0.5x.
fn write_gridlines(svg: &mut String, at: &Layout) {
    let left = at.left;
    let mut tick = 0.0;
    while tick <= at.top {
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{tick:.1}x</text>"##,
            left + at.plot_w,
            at.y(tick),
            at.y(tick),
            left - 6.0,
            at.y(tick) + 4.0
        );
        tick += 0.5;
    }
}

/// One group of bars per category, one bar per mode, the category's name under it.
fn write_bars(
    svg: &mut String,
    at: &Layout,
    rows: &[SummaryRow],
    modes: &[&str],
    categories: &[&str],
) {
    let value = |m: &str, c: &str| {
        rows.iter()
            .find(|r| r.mode == m && r.category == c)
            .and_then(|r| r.speedup)
            .map(|s| s.median)
    };
    let bar_w = at.bar_w;
    for (ci, c) in categories.iter().enumerate() {
        let gx = at.left + ci as f64 * at.group_w + 8.0;
        for (mi, m) in modes.iter().enumerate() {
            if let Some(v) = value(m, c) {
                let x = gx + mi as f64 * bar_w;
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} / {}: {v:.2}x</title></rect>"#,
                    at.y(v),
                    bar_w - 2.0,
                    (at.y(0.0) - at.y(v)).max(0.0),
                    PALETTE[mi % PALETTE.len()],
                    escape(m),
                    escape(c)
                );
            }
        }
        let cx = gx + (at.group_w - 16.0) / 2.0;
        let _ = writeln!(
            svg,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="end" transform="rotate(-40 {cx:.1} {:.1})">{}</text>"#,
            at.y(0.0) + 14.0,
            at.y(0.0) + 14.0,
            escape(c)
        );
    }
}

/// A swatch and the mode's name per mode, under the plot.
fn write_legend(svg: &mut String, at: &Layout, modes: &[&str]) {
    let left = at.left;
    for (mi, m) in modes.iter().enumerate() {
        let ly = at.top_pad + at.plot_h + at.bottom + 18.0 * mi as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{left}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            ly - 10.0,
            PALETTE[mi % PALETTE.len()],
            left + 18.0,
            ly,
            escape(m)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::Spread;

    fn row(mode: &str, category: &str, speedup: Option<f64>) -> SummaryRow {
        SummaryRow {
            mode: mode.into(),
            category: category.into(),
            requests: 1,
            tokens: 1,
            tokens_per_s: Spread {
                median: 1.0,
                min: 1.0,
                max: 1.0,
            },
            speedup: speedup.map(|v| Spread {
                median: v,
                min: v,
                max: v,
            }),
            decode_tokens_per_s: None,
            decode_speedup: None,
            acceptance_rate: None,
            mean_accepted_length: None,
            tree_share: None,
            tree_nodes_per_round: None,
            tree_branch_share: None,
            forced_share: None,
            ttft_median_s: None,
            ttft_later_turns_median_s: None,
            cached_share: None,
            outputs_match: None,
        }
    }

    #[test]
    fn one_bar_per_speculative_mode_and_category() {
        let rows = vec![
            row("plain", "qa", None),
            row("pld", "qa", Some(1.4)),
            row("draft<1>", "qa", Some(0.9)),
            row("pld", "overall", Some(1.2)),
        ];
        let svg = speedup_svg(&rows, "t & t");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<rect x=").count(),
            3 + 2,
            "3 bars + 2 legend keys"
        );
        assert!(svg.contains("pld / qa: 1.40x"));
        assert!(svg.contains("draft&lt;1&gt;") && svg.contains("t &amp; t"));
        assert!(!svg.contains("plain /"));
    }
}
