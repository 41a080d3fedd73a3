//! A progress bar on stderr for `tandem bench`.
//!
//! Why it exists: a full Spec-Bench run takes a long time; the bar shows how far it is and what
//! runs now. On a terminal it redraws one line; elsewhere (CI logs) it prints a line every 10%.

use std::io::{IsTerminal, Write};

pub struct ProgressBar {
    terminal: bool,
    last_decile: usize,
}

impl Default for ProgressBar {
    fn default() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            last_decile: 0,
        }
    }
}

/// The bar's text: `[#####-----]  12/52  what`.
pub fn render(done: usize, total: usize, what: &str) -> String {
    let width = 30;
    let filled = (done * width)
        .checked_div(total)
        .unwrap_or(width)
        .min(width);
    format!(
        "[{}{}] {done:>4}/{total}  {what}",
        "#".repeat(filled),
        "-".repeat(width - filled)
    )
}

impl ProgressBar {
    pub fn update(&mut self, done: usize, total: usize, what: &str) {
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{}", render(done, total, what));
            if done >= total {
                let _ = writeln!(err);
            }
        } else {
            let decile = (done * 10).checked_div(total).unwrap_or(10);
            if decile > self.last_decile || done >= total {
                self.last_decile = decile;
                let _ = writeln!(err, "{}", render(done, total, what));
            }
        }
        let _ = err.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn bar_fills_in_proportion() {
        assert!(render(0, 10, "x").starts_with("[------------------------------]"));
        assert!(render(5, 10, "x").starts_with("[###############---------------]"));
        assert!(render(10, 10, "x").contains("10/10  x"));
        assert!(render(0, 0, "").starts_with("[##############################]"));
    }
}
