//! Guides whose quoted output is checked against real runs
//! (`docs/debugging.md`): a fenced block whose info string carries
//! `check=<name>` after its language, as in
//!
//! ````text
//! ```text check=bm-uart
//! $ umd-dump --hex uart.log
//! submission 1: fence q2:1 after [], ...
//! ...
//! ```
//! ````
//!
//! is a quote of the output named `<name>`, which a test produces and
//! checks with [`check`]. In a block:
//!
//! - a line starting with `$ ` is a command (returned by [`Block::commands`]
//!   for the test to run; not matched);
//! - a line that is `...` alone marks lines left out, and is not matched;
//! - every other line must appear in the output, in the block's order: a
//!   line of the output contains it, where `...` inside it stands for any
//!   text (a clock reading, an address that differs between runs).
//!
//! The guide's text is the test's input, so a quote that no longer matches
//! what the driver prints fails the test that owns the block.

/// One checked block of a guide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The output it quotes (`check=<name>`).
    pub name: String,
    /// Its lines, as written (indentation kept).
    pub lines: Vec<String>,
    /// The line of the guide its first line is on (1-based).
    pub line: usize,
}

impl Block {
    /// The commands of the block (`$ ` lines), without the prompt.
    pub fn commands(&self) -> Vec<&str> {
        self.lines.iter().filter_map(|l| l.trim_start().strip_prefix("$ ")).collect()
    }

    /// The lines that must appear in the output.
    pub fn expected(&self) -> Vec<&str> {
        self.lines
            .iter()
            .map(|l| l.trim_end())
            .filter(|l| {
                let t = l.trim_start();
                !t.is_empty() && t != "..." && !t.starts_with("$ ")
            })
            .collect()
    }
}

/// Every checked block of `guide` (a Markdown text), in order.
pub fn blocks(guide: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in guide.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match open.take() {
            Some(b) if fence => out.push(b),
            Some(mut b) => {
                b.lines.push(line.to_string());
                open = Some(b);
            }
            None if fence => {
                let info = line.trim_start().trim_start_matches('`');
                let name = info.split_whitespace().find_map(|w| w.strip_prefix("check="));
                // An unchecked block is skipped like a checked one.
                open = Some(Block { name: name.unwrap_or("").to_string(), lines: Vec::new(), line: i + 2 });
            }
            None => {}
        }
    }
    out.retain(|b| !b.name.is_empty());
    out
}

/// The checked blocks of `guide` named `name`; an error when there is none
/// (a renamed block would otherwise check nothing).
pub fn named<'g>(all: &'g [Block], name: &str) -> Result<Vec<&'g Block>, String> {
    let v: Vec<&Block> = all.iter().filter(|b| b.name == name).collect();
    if v.is_empty() {
        return Err(format!("the guide has no block with check={name}"));
    }
    Ok(v)
}

/// Whether `line` contains `pattern`, `...` in it standing for any text.
pub fn line_matches(line: &str, pattern: &str) -> bool {
    let mut rest = line;
    for piece in pattern.trim().split("...").filter(|p| !p.is_empty()) {
        match rest.find(piece) {
            Some(p) => rest = &rest[p + piece.len()..],
            None => return false,
        }
    }
    true
}

/// Checks that every expected line of `block` appears in `output`, in
/// order; the error names the first line missing and shows the output.
pub fn check(block: &Block, output: &str) -> Result<(), String> {
    let lines: Vec<&str> = output.lines().collect();
    let mut from = 0usize;
    for want in block.expected() {
        match lines.iter().skip(from).position(|l| line_matches(l, want)) {
            Some(p) => from += p + 1,
            None => {
                return Err(format!(
                    "guide block check={} (line {}): {want:?} is not in the output (after line {from} of it):\n{output}",
                    block.name, block.line
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUIDE: &str = "intro\n\n```text check=out\n$ tool --flag file\nfirst ... line\n...\n  second\n```\n\n```rust\nnot checked\n```\n";

    #[test]
    fn blocks_and_commands() {
        let b = blocks(GUIDE);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].name, "out");
        assert_eq!(b[0].line, 4);
        assert_eq!(b[0].commands(), ["tool --flag file"]);
        assert_eq!(b[0].expected(), ["first ... line", "  second"]);
        assert!(named(&b, "other").is_err());
    }

    #[test]
    fn matching_in_order_with_wildcards() {
        let b = &blocks(GUIDE)[0];
        assert!(check(b, "noise\nthe first 123 ns line\nx\n    second here\n").is_ok());
        // Out of order, or a line changed: refused.
        assert!(check(b, "second\nthe first 1 line\n").is_err());
        assert!(check(b, "the first 1 lane\nsecond\n").is_err());
        assert!(line_matches("a 0x12 b 7", "a ... b ..."));
        assert!(!line_matches("b a", "a ... b"));
    }
}
