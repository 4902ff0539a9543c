//! Rendering: an aligned text table for people, JSON for scripts.

use serde::{Deserialize, Serialize};

use super::{Check, Status};

/// Widest a column may grow to keep the table readable; longer cells overflow their own row.
const COLUMN_WIDTH_MAX: usize = 44;

/// Counts per status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// OK checks.
    pub ok: usize,
    /// WARN checks.
    pub warn: usize,
    /// FAIL checks.
    pub fail: usize,
}

/// The JSON document: every check plus the counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Checks in report order.
    pub checks: Vec<Check>,
    /// Counts per status.
    pub summary: Summary,
}

/// Counts checks per status.
pub fn summarize(checks: &[Check]) -> Summary {
    let mut s = Summary::default();
    for c in checks {
        match c.status {
            Status::Ok => s.ok += 1,
            Status::Warn => s.warn += 1,
            Status::Fail => s.fail += 1,
        }
    }
    s
}

/// Pretty JSON of [`Report`].
pub fn to_json(checks: &[Check]) -> String {
    let report = Report {
        checks: checks.to_vec(),
        summary: summarize(checks),
    };
    // Serialising plain strings and enums cannot fail.
    serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Aligned table: STATUS CHECK CURRENT RECOMMENDED WHY, then a summary line.
pub fn to_table(checks: &[Check]) -> String {
    let header = ["STATUS", "CHECK", "CURRENT", "RECOMMENDED"];
    let mut widths = header.map(str::len);
    for c in checks {
        let cells = [c.status.label(), &c.name, &c.current, &c.recommended];
        for (w, cell) in widths.iter_mut().zip(cells) {
            *w = (*w).max(cell.chars().count().min(COLUMN_WIDTH_MAX));
        }
    }
    let mut out = String::new();
    let mut row = |cells: [&str; 4], why: &str| {
        for (cell, w) in cells.iter().zip(widths) {
            out.push_str(cell);
            let pad = w.saturating_sub(cell.chars().count()) + 2;
            out.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(why);
        out.push('\n');
    };
    row(header, "WHY");
    for c in checks {
        row(
            [c.status.label(), &c.name, &c.current, &c.recommended],
            &c.why,
        );
    }
    let s = summarize(checks);
    out.push_str(&format!("\n{} ok, {} warn, {} fail", s.ok, s.warn, s.fail));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Check> {
        vec![
            Check::new(
                "net.core.somaxconn",
                Status::Warn,
                "4096",
                ">= 65535",
                "accept queue",
            ),
            Check::new(
                "nic.eth0.rings",
                Status::Fail,
                "rx 512 of 4096",
                "rx 4096",
                "drops",
            ),
            Check::new("irqbalance", Status::Ok, "not running", "-", "ok"),
        ]
    }

    #[test]
    fn table_is_aligned() {
        let table = to_table(&sample());
        let lines: Vec<&str> = table.lines().collect();
        let col = lines[0].find("CURRENT").unwrap();
        for line in &lines[1..4] {
            assert_eq!(line.chars().nth(col - 1), Some(' '));
            assert_ne!(line.chars().nth(col), Some(' '), "{line}");
        }
        assert!(lines[2].starts_with("FAIL    nic.eth0.rings"));
        assert!(table.ends_with("1 ok, 1 warn, 1 fail"));
    }

    #[test]
    fn json_round_trips() {
        let checks = sample();
        let back: Report = serde_json::from_str(&to_json(&checks)).unwrap();
        assert_eq!(back.checks, checks);
        assert_eq!(
            back.summary,
            Summary {
                ok: 1,
                warn: 1,
                fail: 1
            }
        );
        assert!(to_json(&checks).contains("\"status\": \"fail\""));
    }
}
