//! `stowplan plan --lengths FILE --column NAME` on Arrow IPC files (the `arrow` feature): the
//! lengths of a list column (from its offsets) or an integer column, in file and stream
//! layout, the same plan as from the same lengths as text, and every refusal naming the file,
//! the column and the row. Without the feature, an Arrow file is recognized and refused
//! saying how to build a binary that reads it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn stowplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stowplan")).args(args).output().expect("runs stowplan")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stowplan-arrow-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn plan_json(lengths: &Path, column: &[&str]) -> Output {
    let mut args = vec!["plan", "--packing-length", "64", "--world-size", "2", "--json", "--lengths"];
    args.push(lengths.to_str().unwrap());
    args.extend_from_slice(column);
    stowplan(&args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[cfg(not(feature = "arrow"))]
#[test]
fn without_the_feature_an_arrow_file_is_recognized_and_refused() {
    let dir = temp_dir("without");
    let path = dir.join("data.arrow");
    std::fs::write(&path, b"ARROW1\0\0 and the rest of a file").unwrap();
    let out = plan_json(&path, &["--column", "input_ids"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("is an Arrow IPC file: this stowplan was built without Arrow support"), "{err}");
    assert!(err.contains("--features arrow"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[cfg(feature = "arrow")]
mod with_arrow {
    use std::sync::Arc;

    use arrow_array::builder::{Int32Builder, ListBuilder};
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow_ipc::writer::{FileWriter, StreamWriter};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    /// A list<int32> column of rows with `lengths` values (None: a null row).
    fn list_column(lengths: &[Option<usize>]) -> ArrayRef {
        let mut b = ListBuilder::new(Int32Builder::new());
        for (i, n) in lengths.iter().enumerate() {
            match n {
                Some(n) => {
                    b.values().append_slice(&vec![i as i32; *n]);
                    b.append(true);
                }
                None => b.append(false),
            }
        }
        Arc::new(b.finish())
    }

    /// Writes `batches` (one schema) as an Arrow IPC file or stream.
    fn write(path: &Path, stream: bool, batches: &[RecordBatch]) {
        let file = std::fs::File::create(path).unwrap();
        let schema = batches[0].schema();
        if stream {
            let mut w = StreamWriter::try_new(file, &schema).unwrap();
            batches.iter().for_each(|b| w.write(b).unwrap());
            w.finish().unwrap();
        } else {
            let mut w = FileWriter::try_new(file, &schema).unwrap();
            batches.iter().for_each(|b| w.write(b).unwrap());
            w.finish().unwrap();
        }
    }

    fn batch(ids: &[Option<usize>], n: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("input_ids", DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))), true),
            Field::new("n", DataType::Int64, false),
            Field::new("text", DataType::Utf8, false),
        ]));
        let text: StringArray = n.iter().map(|v| Some(v.to_string())).collect();
        RecordBatch::try_new(schema, vec![list_column(ids), Arc::new(Int64Array::from(n.to_vec())), Arc::new(text)])
            .unwrap()
    }

    fn json(out: &Output) -> serde_json::Value {
        assert!(out.status.success(), "stderr: {}", stderr(out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    #[test]
    fn a_list_or_integer_column_gives_the_plan_of_the_same_lengths_as_text() {
        let dir = temp_dir("plan");
        let lengths: Vec<usize> = (0..300).map(|i| (i * 37 + 11) % 70 + 1).collect(); // plan: ≥ 1 token each
        let (a, b) = lengths.split_at(170);
        let batches = [
            batch(&a.iter().map(|&n| Some(n)).collect::<Vec<_>>(), &a.iter().map(|&n| n as i64).collect::<Vec<_>>()),
            batch(&b.iter().map(|&n| Some(n)).collect::<Vec<_>>(), &b.iter().map(|&n| n as i64).collect::<Vec<_>>()),
        ];
        let text = dir.join("lengths.txt");
        std::fs::write(&text, lengths.iter().map(|n| format!("{n}\n")).collect::<String>()).unwrap();
        let want = json(&plan_json(&text, &[]));
        for stream in [false, true] {
            let path = dir.join(if stream { "data.stream.arrow" } else { "data.arrow" });
            write(&path, stream, &batches);
            for column in ["input_ids", "n"] {
                let got = json(&plan_json(&path, &["--column", column]));
                assert_eq!(got["samples"], 300);
                assert_eq!(got["raw_checksum"], want["raw_checksum"], "stream {stream}, column {column}");
                assert_eq!(got["aligned_checksum"], want["aligned_checksum"]);
                assert_eq!(got["source"], format!("{} (column {column})", path.display()));
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn refusals_name_the_file_the_column_and_the_row() {
        let dir = temp_dir("refusals");
        let path = dir.join("data.arrow");
        write(&path, false, &[batch(&[Some(3), Some(2)], &[3, 2]), batch(&[Some(1), None], &[1, -4])]);
        let cases: [(&[&str], &str); 6] = [
            (
                &[],
                "is an Arrow IPC file: name the column of token ids (or of lengths) with --column, e.g. --column input_ids",
            ),
            (&["--column", "ids"], "no column \"ids\" (columns: [\"input_ids\", \"n\", \"text\"])"),
            (
                &["--column", "text"],
                "column \"text\" has type Utf8: give a list column (e.g. token ids) or an integer column",
            ),
            (&["--column", "input_ids"], "column \"input_ids\", row 3 (from 0): null (every row needs a length)"),
            (&["--column", "n"], "column \"n\", row 3 (from 0): the length -4 is negative"),
            (&["--column", "n", "--cache-dir", "/tmp"], "an Arrow IPC file gives its token lengths directly"),
        ];
        for (args, want) in cases {
            let out = plan_json(&path, args);
            assert_eq!(out.status.code(), Some(2), "{args:?}");
            assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        }
        // A cut-off file is refused as unreadable; a text file's --column is a number.
        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.join("cut.arrow");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let out = plan_json(&cut, &["--column", "n"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains("not a readable Arrow IPC file"), "{}", stderr(&out));
        // Damage anywhere (cut short, or a byte changed) is refused or read, never a crash: the
        // reader's own panics on malformed metadata are caught.
        for stream in [false, true] {
            let path = dir.join(if stream { "small.stream" } else { "small.arrow" });
            write(&path, stream, &[batch(&[Some(3), Some(2)], &[3, 2])]);
            let bytes = std::fs::read(&path).unwrap();
            let damaged = dir.join("damaged.arrow");
            let cuts = (8..bytes.len()).step_by(13).map(|n| bytes[..n].to_vec());
            let flips = (0..bytes.len()).step_by(7).map(|i| {
                let mut b = bytes.clone();
                b[i] ^= 0x5a;
                b
            });
            for copy in cuts.chain(flips) {
                std::fs::write(&damaged, &copy).unwrap();
                let out = stowplan(&[
                    "plan",
                    "--packing-length",
                    "64",
                    "--backend",
                    "native",
                    "--json",
                    "--lengths",
                    damaged.to_str().unwrap(),
                    "--column",
                    "n",
                ]);
                assert!(matches!(out.status.code(), Some(0 | 2)), "{:?}: {}", out.status, stderr(&out));
            }
        }
        // A stream cut between two messages (here: its end-of-stream marker) is refused, not
        // read as fewer rows.
        let stream = dir.join("whole.stream");
        write(&stream, true, &[batch(&[Some(3), Some(2)], &[3, 2]), batch(&[Some(1)], &[1])]);
        let bytes = std::fs::read(&stream).unwrap();
        std::fs::write(&cut, &bytes[..bytes.len() - 8]).unwrap();
        let out = plan_json(&cut, &["--column", "n"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains("ends without its end-of-stream marker"), "{}", stderr(&out));
        // Arrow data piped on standard input: said so, with the way that works.
        let piped = Command::new(env!("CARGO_BIN_EXE_stowplan"))
            .args(["plan", "--packing-length", "64", "--lengths", "-", "--column", "n"])
            .stdin(std::fs::File::open(&stream).unwrap())
            .output()
            .unwrap();
        assert_eq!(piped.status.code(), Some(2));
        assert!(
            stderr(&piped).contains("holds Arrow IPC data: `stowplan plan` reads it from a file path"),
            "{}",
            stderr(&piped)
        );
        let text = dir.join("lengths.txt");
        std::fs::write(&text, "3\n4\n").unwrap();
        let out = plan_json(&text, &["--column", "input_ids"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains("a text file's column is its 1-based number"), "{}", stderr(&out));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
