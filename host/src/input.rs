//! Reading lengths: one integer per line, or a JSON array of integers.

use crate::Error;
use crate::error::excerpt;

/// How much of a bad line an error message quotes.
const QUOTED: usize = 80;

/// The built-in default workload: 4,096 RL rollout lengths (512 prompts × 8 samples, a copy
/// of `shared/workloads/rl-math-8k.txt`).
pub const DEFAULT_WORKLOAD: &str = include_str!("../assets/rl-math-8k.txt");

/// The name of [`DEFAULT_WORKLOAD`] as shown to users.
pub const DEFAULT_WORKLOAD_NAME: &str = "built-in rl-math-8k (4,096 rollouts)";

/// A built-in workload: lengths embedded in the library, chosen by name (the CLI's
/// `--workload NAME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The name it is chosen by (`rl-math-8k`).
    pub name: &'static str,
    /// What the lengths are, in one line (listed by `stowplan --help`).
    pub description: &'static str,
    /// How reports name it as a source (`built-in rl-math-8k (4,096 rollouts)`).
    pub source: &'static str,
    /// The lengths, in a format [`parse_lengths`] reads.
    pub text: &'static str,
}

/// Every built-in workload, the default ([`DEFAULT_WORKLOAD`]) first. Only small assets are
/// embedded; the large shared workloads (100k+ lines) are read from files.
pub const WORKLOADS: &[Workload] = &[Workload {
    name: "rl-math-8k",
    description: "an RL step on math/reasoning: 512 prompts × 8 rollouts, 4,096 lengths capped at 8,192 tokens",
    source: DEFAULT_WORKLOAD_NAME,
    text: DEFAULT_WORKLOAD,
}];

/// The built-in workload called `name`, if there is one.
pub fn workload(name: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|w| w.name == name)
}

/// Parses lengths from `text`: a JSON array of non-negative integers (when the first
/// non-blank character is `[`), or one non-negative integer per line (blank lines and lines
/// starting with `#` are skipped). Errors name the line (or JSON position) at fault.
pub fn parse_lengths(text: &str) -> Result<Vec<u64>, Error> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        // serde_json's message quotes the offending value (a string of any length): cut it.
        return serde_json::from_str::<Vec<u64>>(trimmed).map_err(|e| {
            Error::InvalidArgument(format!(
                "lengths: expected a JSON array of integers in 0..=18446744073709551615: {}",
                excerpt(&e.to_string(), 2 * QUOTED)
            ))
        });
    }
    let mut out = Vec::new();
    for (no, line) in text.lines().enumerate() {
        if let Some(v) = parse_line(no as u64 + 1, line)? {
            out.push(v);
        }
    }
    Ok(out)
}

/// One line of a lengths file (numbered `no` from 1 in errors): `None` for a blank line or a
/// `#` comment, else its integer.
fn parse_line(no: u64, line: &str) -> Result<Option<u64>, Error> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    line.parse::<u64>().map(Some).map_err(|e| {
        Error::InvalidArgument(format!(
            "lengths, line {no}: {:?} is not an integer in 0..=18446744073709551615 ({e})",
            excerpt(line, QUOTED)
        ))
    })
}

/// Lengths parsed from text that arrives in pieces (one integer per line, blank lines and `#`
/// comments skipped, as [`parse_lengths`] reads lines): [`feed`](Self::feed) each piece,
/// then [`finish`](Self::finish) for a last line without a newline. Holds at most one
/// partial line, and refuses any line longer than 4 KiB (no length needs it), wherever the
/// pieces were cut.
#[derive(Debug, Default)]
pub struct LengthLines {
    /// The partial line carried to the next piece.
    carry: Vec<u8>,
    /// Lines read so far.
    lines: u64,
}

/// The longest line [`LengthLines`] accepts.
const MAX_LINE: usize = 4096;

impl LengthLines {
    /// A parser at line 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the complete lines of `bytes` (with the partial line left by the previous
    /// piece) into `out`; keeps a trailing partial line for the next piece.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u64>) -> Result<(), Error> {
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (line, tail) = rest.split_at(nl);
            rest = &tail[1..];
            self.check_length(self.carry.len() + line.len())?;
            if self.carry.is_empty() {
                self.line(line, out)?;
            } else {
                let mut whole = std::mem::take(&mut self.carry);
                whole.extend_from_slice(line);
                self.line(&whole, out)?;
            }
        }
        self.check_length(self.carry.len() + rest.len())?;
        self.carry.extend_from_slice(rest);
        Ok(())
    }

    /// Refuses the next line at `len` bytes when that is over [`MAX_LINE`], however the
    /// text was cut into pieces.
    fn check_length(&self, len: usize) -> Result<(), Error> {
        if len > MAX_LINE {
            return Err(Error::InvalidArgument(format!(
                "lengths, line {}: longer than {MAX_LINE} bytes (one integer per line is expected)",
                self.lines + 1
            )));
        }
        Ok(())
    }

    /// Parses the last line if it had no newline.
    pub fn finish(&mut self, out: &mut Vec<u64>) -> Result<(), Error> {
        let last = std::mem::take(&mut self.carry);
        if last.is_empty() { Ok(()) } else { self.line(&last, out) }
    }

    /// Lines read so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<u64>) -> Result<(), Error> {
        self.lines += 1;
        // The common line: 1 to 19 ASCII digits (no sign, no spaces), which cannot overflow.
        if (1..=19).contains(&line.len()) && line.iter().all(u8::is_ascii_digit) {
            out.push(line.iter().fold(0u64, |v, &d| v * 10 + u64::from(d - b'0')));
            return Ok(());
        }
        let text = std::str::from_utf8(line)
            .map_err(|_| Error::InvalidArgument(format!("lengths, line {}: not UTF-8 text", self.lines)))?;
        if let Some(v) = parse_line(self.lines, text)? {
            out.push(v);
        }
        Ok(())
    }
}

/// Parses lengths from column `column` (1-based) of a simple delimited text file: fields
/// separated by tabs (when the line holds one), else commas (when it holds one), else
/// whitespace. Blank lines and lines starting with `#` are skipped; when the first remaining
/// line's field is not an integer it is taken as a header. Errors name the line and column.
pub fn parse_column(text: &str, column: usize) -> Result<Vec<u64>, Error> {
    if column == 0 {
        return Err(Error::InvalidArgument("column is 1-based: it must be at least 1 (got 0)".to_string()));
    }
    let mut out = Vec::new();
    let mut first = true;
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let field = if line.contains('\t') {
            line.split('\t').nth(column - 1)
        } else if line.contains(',') {
            line.split(',').nth(column - 1)
        } else {
            line.split_whitespace().nth(column - 1)
        };
        let Some(field) = field.map(str::trim) else {
            return Err(Error::InvalidArgument(format!("lengths, line {}: has no column {column}", no + 1)));
        };
        match field.parse::<u64>() {
            Ok(v) => out.push(v),
            Err(_) if first => {}
            Err(e) => {
                return Err(Error::InvalidArgument(format!(
                    "lengths, line {}, column {column}: {:?} is not an integer in 0..=18446744073709551615 ({e})",
                    no + 1,
                    excerpt(field, QUOTED)
                )));
            }
        }
        first = false;
    }
    Ok(out)
}

/// The fields of one line of a delimited text file: tab-separated when the line holds a
/// tab, else comma-separated when it holds a comma, else separated by whitespace.
fn fields(line: &str) -> Vec<&str> {
    if line.contains('\t') {
        line.split('\t').map(str::trim).collect()
    } else if line.contains(',') {
        line.split(',').map(str::trim).collect()
    } else {
        line.split_whitespace().collect()
    }
}

/// Parses a table of sizes from a delimited text file whose first line (after blank lines
/// and `#` comments) is a header naming the columns, tokens first (as
/// `../shared/workloads/vlm-mix-100k.tsv`): per data line the first column, then the
/// columns called `names`, in that order — row by row, `1 + names.len()` values a row.
/// Returns the first column's name and the rows. Errors name the line and the column; an
/// unknown name lists the header's.
pub fn parse_table(text: &str, names: &[&str]) -> Result<(String, Vec<u64>), Error> {
    let mut lines = text.lines().enumerate().map(|(no, l)| (no as u64 + 1, l)).filter(|(_, l)| !TableRows::skipped(l));
    let Some((_, header)) = lines.next() else {
        return Err(Error::InvalidArgument("the table is empty: it needs a header line naming its columns".into()));
    };
    let table = TableRows::new(header, names)?;
    let mut out = Vec::new();
    for (no, line) in lines {
        table.row(no, line, &mut out)?;
    }
    Ok((table.first().to_string(), out))
}

/// The longest line a stream of table rows may have (`stowplan pack --stream --limit`):
/// longer ones are refused before they are held, so memory stays bounded.
pub const MAX_TABLE_LINE: usize = 1 << 16;

/// A table's rows line by line (for [`parse_table`] and streams of rows): the header names
/// the columns; each data line gives its first column, then the named ones, in that order.
#[derive(Clone, Debug)]
pub struct TableRows {
    /// The header's fields.
    head: Vec<String>,
    /// The columns read: 0, then each name's.
    columns: Vec<usize>,
}

impl TableRows {
    /// The reader of the table whose header line is `header`, for the columns `names`.
    /// Errors name a column the header lacks (listing the header's) or names twice.
    pub fn new(header: &str, names: &[&str]) -> Result<Self, Error> {
        let head: Vec<String> = fields(header.trim()).into_iter().map(String::from).collect();
        let mut columns = vec![0usize];
        for name in names {
            if head.iter().filter(|h| h == name).count() > 1 {
                return Err(Error::InvalidArgument(format!(
                    "the table's header names column {:?} twice: which one is meant is not clear",
                    excerpt(name, QUOTED)
                )));
            }
            match head.iter().position(|h| h == name) {
                Some(c) => columns.push(c),
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "the table has no column {:?}; its header names {}",
                        excerpt(name, QUOTED),
                        excerpt(&head.join(", "), 2 * QUOTED)
                    )));
                }
            }
        }
        Ok(Self { head, columns })
    }

    /// Whether a line is not data: blank, or a `#` comment.
    pub fn skipped(line: &str) -> bool {
        let t = line.trim();
        t.is_empty() || t.starts_with('#')
    }

    /// The first column's name.
    pub fn first(&self) -> &str {
        &self.head[0]
    }

    /// Appends data line `no`'s values (1 + names) to `out`. Errors name the line and the
    /// column; nothing is appended then.
    pub fn row(&self, no: u64, line: &str, out: &mut Vec<u64>) -> Result<(), Error> {
        let f = fields(line.trim());
        let at = out.len();
        for &c in &self.columns {
            let Some(field) = f.get(c) else {
                out.truncate(at);
                return Err(Error::InvalidArgument(format!("table, line {no}: has no column {:?}", self.head[c])));
            };
            match field.parse::<u64>() {
                Ok(v) => out.push(v),
                Err(e) => {
                    out.truncate(at);
                    return Err(Error::InvalidArgument(format!(
                        "table, line {no}, column {:?}: {:?} is not an integer in 0..=18446744073709551615 ({e})",
                        self.head[c],
                        excerpt(field, QUOTED)
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_quote_a_bounded_excerpt_of_a_bad_line() {
        let line = "x".repeat(10_000_000);
        let e = parse_lengths(&format!("5\n{line}\n")).unwrap_err().to_string();
        assert!(e.len() < 300, "{} bytes", e.len());
        assert!(e.contains("line 2") && e.contains("10000000 bytes, the first 80 shown"), "{e}");
        let e = parse_column(&format!("a,b\n1,{line}\n"), 2).unwrap_err().to_string();
        assert!(e.len() < 300 && e.contains("column 2"), "{e}");
        // Found by the `lengths` fuzz target: serde_json quotes a bad string value whole.
        let e = parse_lengths(&format!("[\"{line}\"]")).unwrap_err().to_string();
        assert!(e.len() < 400 && e.contains("invalid type: string"), "{e}");
        let e = parse_table(&format!("tokens\timages\n1\t{line}\n"), &["images"]).unwrap_err().to_string();
        assert!(e.len() < 300 && e.contains("line 2, column \"images\""), "{e}");
    }

    #[test]
    fn a_table_gives_the_first_column_then_the_named_ones() {
        let text = "# vlm\ntokens\timage_tokens\timages\n862\t721\t1\n\n181\t0\t0\n";
        assert_eq!(
            parse_table(text, &["images", "image_tokens"]).unwrap(),
            ("tokens".into(), vec![862, 1, 721, 181, 0, 0])
        );
        assert_eq!(parse_table("a,b\n1,2\n", &[]).unwrap(), ("a".into(), vec![1]));
        let e = parse_table(text, &["frames"]).unwrap_err().to_string();
        assert!(e.contains("no column \"frames\"; its header names tokens, image_tokens, images"), "{e}");
        let e = parse_table("tokens\timages\n5\n", &["images"]).unwrap_err().to_string();
        assert!(e.contains("line 2: has no column \"images\""), "{e}");
        assert!(parse_table("# nothing\n", &[]).unwrap_err().to_string().contains("needs a header"));
        let e = parse_table("tokens\timages\timages\n1\t2\t3\n", &["images"]).unwrap_err().to_string();
        assert!(e.contains("names column \"images\" twice"), "{e}");
    }

    use proptest::prelude::*;

    proptest! {
        /// Text fed in any pieces parses as the whole text does, errors included.
        #[test]
        fn length_lines_in_pieces_parse_as_the_whole(
            items in proptest::collection::vec(proptest::prop_oneof![
                (0u64..100_000).prop_map(|v| v.to_string()),
                proptest::strategy::Just(String::new()),
                proptest::strategy::Just(" # note".to_string()),
                proptest::strategy::Just("x1".to_string()),
            ], 0..40),
            cuts in proptest::collection::vec(0usize..400, 0..8),
            newline_at_end in proptest::bool::ANY,
        ) {
            let mut text = items.join("\n");
            if newline_at_end {
                text.push('\n');
            }
            let whole = parse_lengths(&text).map_err(|e| e.to_string());
            if text.trim_start().starts_with('[') {
                return Ok(());
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            cuts.sort_unstable();
            let mut parser = LengthLines::new();
            let mut out = Vec::new();
            let mut start = 0;
            let fed = (|| {
                for &c in cuts.iter().chain([text.len()].iter()) {
                    parser.feed(&text.as_bytes()[start..c], &mut out)?;
                    start = c;
                }
                parser.finish(&mut out)
            })()
            .map(|()| out)
            .map_err(|e| e.to_string());
            prop_assert_eq!(fed, whole);
        }
    }

    #[test]
    fn length_lines_refuse_a_line_without_end() {
        let mut parser = LengthLines::new();
        let e = parser.feed(&[b'1'; 5000], &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("longer than 4096 bytes"), "{e}");
    }

    #[test]
    fn lines_and_json() {
        assert_eq!(parse_lengths("3\n\n# c\n 5 \n").unwrap(), vec![3, 5]);
        assert_eq!(parse_lengths(" [1, 2,3]").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_lengths(&DEFAULT_WORKLOAD).unwrap().len(), 4096);
    }

    #[test]
    fn workloads_by_name_default_first() {
        assert_eq!(WORKLOADS[0].text, DEFAULT_WORKLOAD);
        assert_eq!(workload("rl-math-8k"), Some(&WORKLOADS[0]));
        assert_eq!(workload("nope"), None);
        for w in WORKLOADS {
            assert!(!parse_lengths(w.text).unwrap().is_empty(), "{}", w.name);
        }
    }

    #[test]
    fn columns() {
        assert_eq!(parse_column("id\tlen\na\t3\nb\t5\n", 2).unwrap(), vec![3, 5]);
        assert_eq!(parse_column("# x\n1,7\n2,9\n", 2).unwrap(), vec![7, 9]);
        assert_eq!(parse_column("1 7\n2   9\n", 1).unwrap(), vec![1, 2]);
        let e = parse_column("1,7\n2\n", 2).unwrap_err();
        assert!(e.to_string().contains("line 2: has no column 2"), "{e}");
        let e = parse_column("1,7\n2,x\n", 2).unwrap_err();
        assert!(e.to_string().contains("line 2, column 2"), "{e}");
        assert!(parse_column("1", 0).unwrap_err().to_string().contains("at least 1"));
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_lengths("1\n-4\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse_lengths("[1, -2]").unwrap_err();
        assert_eq!(e.kind(), "invalid-argument");
    }
}
