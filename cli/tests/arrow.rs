//! `stowplan plan --lengths FILE --column NAME` on Arrow IPC files (the `arrow` feature): the
//! lengths of a list column (from its offsets) or an integer column, in file and stream
//! layout, the same plan as from the same lengths as text, and every refusal naming the file,
//! the column and the row. Without the feature, an Arrow file is recognized and refused
//! saying how to build a binary that reads it.
//!
//! `stowplan pack-dataset IN OUT`: the packed rows (the plan's, TRL's `bfd_split` and
//! `wrapped`, every overflow policy) with `seq_lengths` and `position_ids`, and every refusal
//! leaving OUT as it was. (Equality with `stowplan.arrow.pack_table`, row for row, on a real
//! `datasets` cache file: `sdk-python/tests/test_hf.py`.)

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
    let mut args = vec!["plan", "--capacity", "64", "--world-size", "2", "--json", "--lengths"];
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

#[cfg(not(feature = "arrow"))]
#[test]
fn without_the_feature_pack_dataset_refuses_saying_how_to_build() {
    let dir = temp_dir("without-pack");
    let path = dir.join("data.arrow");
    std::fs::write(&path, b"ARROW1\0\0 and the rest of a file").unwrap();
    let out = stowplan(&["pack-dataset", path.to_str().unwrap(), "out.arrow", "--capacity", "8"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--features arrow"), "{}", stderr(&out));
    std::fs::remove_dir_all(dir).unwrap();
}

#[cfg(feature = "arrow")]
mod with_arrow {
    use std::sync::Arc;

    use arrow_array::builder::{Int32Builder, ListBuilder, StringDictionaryBuilder};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;
    use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow_ipc::reader::StreamReader;
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
                    "--capacity",
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
            .args(["plan", "--capacity", "64", "--lengths", "-", "--column", "n"])
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

    fn pack_dataset(input: &Path, output: &Path, args: &[&str]) -> Output {
        let mut all = vec!["pack-dataset", input.to_str().unwrap(), output.to_str().unwrap()];
        all.extend_from_slice(args);
        stowplan(&all)
    }

    /// The rows of a list<int32> column of the packed table at `path`.
    fn rows(path: &Path, column: &str) -> Vec<Vec<i32>> {
        let reader = StreamReader::try_new(std::fs::File::open(path).unwrap(), None).unwrap();
        let mut out = Vec::new();
        for batch in reader {
            let batch = batch.unwrap();
            let list = batch.column_by_name(column).unwrap().as_list::<i32>();
            for r in 0..list.len() {
                out.push(list.value(r).as_primitive::<Int32Type>().values().to_vec());
            }
        }
        out
    }

    #[test]
    fn pack_dataset_writes_the_packed_rows_of_every_strategy() {
        let dir = temp_dir("pack-dataset");
        // Rows of 5, 0, 2, 3 and 1 tokens in two batches, each row's values its number in
        // its batch: 0, 1 | 0, 1, 2.
        let input = dir.join("tokenized.arrow");
        write(&input, false, &[batch(&[Some(5), Some(0)], &[5, 0]), batch(&[Some(2), Some(3), Some(1)], &[2, 3, 1])]);
        let out = dir.join("packed.arrow");
        let cases: [(&[&str], &[&[i32]], &[&[i32]]); 5] = [
            // BFD over the items 4 (row 0 truncated), 2, 3, 1: bins {0}, {3, 4}, {2}.
            (&[], &[&[0, 0, 0, 0], &[1, 1, 1, 2], &[0, 0]], &[&[4], &[3, 1], &[2]]),
            (&["--overflow", "drop"], &[&[1, 1, 1, 2], &[0, 0]], &[&[3, 1], &[2]]),
            // Items 4 and 1 (row 0's fragments), 2, 3, 1: bins {0}, {1, 3}, {2, 4}, a bin's
            // items in item order.
            (&["--strategy", "bfd_split"], &[&[0, 0, 0, 0], &[0, 1, 1, 1], &[0, 0, 2]], &[&[4], &[1, 3], &[2, 1]]),
            (&["--strategy", "next-fit"], &[&[0, 0, 0, 0], &[0, 0], &[1, 1, 1, 2]], &[&[4], &[2], &[3, 1]]),
            (&["--strategy", "wrapped"], &[&[0, 0, 0, 0], &[0, 0, 0, 1], &[1, 1, 2]], &[&[4], &[1, 2, 1], &[2, 1]]),
        ];
        for (args, want, seq_lengths) in cases {
            let mut all = vec!["--capacity", "4", "--columns", "input_ids", "--position-ids", "--json"];
            all.extend_from_slice(args);
            let report = json(&pack_dataset(&input, &out, &all));
            assert_eq!(rows(&out, "input_ids"), want, "{args:?}");
            assert_eq!(rows(&out, "seq_lengths"), seq_lengths, "{args:?}");
            let positions: Vec<Vec<i32>> = seq_lengths.iter().map(|r| r.iter().flat_map(|&n| 0..n).collect()).collect();
            assert_eq!(rows(&out, "position_ids"), positions, "{args:?}");
            assert_eq!(report["rows"], 5);
            assert_eq!(report["packed_rows"], want.len());
            assert_eq!(report["bytes"], std::fs::metadata(&out).unwrap().len());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn pack_dataset_refusals_name_the_column_and_row_and_leave_the_output_as_it_was() {
        let dir = temp_dir("pack-refusals");
        let good = dir.join("good.arrow");
        write(&good, true, &[batch(&[Some(5), Some(2)], &[5, 2])]);
        let nulls = dir.join("nulls.arrow");
        write(&nulls, false, &[batch(&[Some(3), Some(2)], &[3, 2]), batch(&[Some(1), None], &[1, 4])]);
        let empty = dir.join("empty.arrow");
        write(&empty, false, &[batch(&[], &[])]);
        // Two list columns whose rows differ in length at row 1.
        let two = dir.join("two.arrow");
        let schema = Arc::new(Schema::new(vec![
            Field::new("input_ids", DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))), true),
            Field::new("labels", DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))), true),
        ]));
        let mismatched =
            RecordBatch::try_new(schema, vec![list_column(&[Some(2), Some(3)]), list_column(&[Some(2), Some(4)])])
                .unwrap();
        write(&two, false, &[mismatched]);
        // A list of dictionary-encoded strings, and a schema naming a column twice.
        let strings = dir.join("strings.arrow");
        let mut words = ListBuilder::new(StringDictionaryBuilder::<arrow_array::types::Int32Type>::new());
        words.values().append_value("a");
        words.append(true);
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let field = Field::new("words", DataType::List(Arc::new(Field::new_list_field(dict, true))), true);
        let words: ArrayRef = Arc::new(words.finish());
        write(&strings, true, &[RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![words]).unwrap()]);
        let dup = dir.join("dup.arrow");
        let list = DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true)));
        let twice = Schema::new(vec![Field::new("input_ids", list.clone(), true), Field::new("input_ids", list, true)]);
        let columns = vec![list_column(&[Some(1)]), list_column(&[Some(1)])];
        write(&dup, true, &[RecordBatch::try_new(Arc::new(twice), columns).unwrap()]);
        let text = dir.join("lengths.txt");
        std::fs::write(&text, "3\n4\n").unwrap();
        let out = dir.join("packed.arrow");
        std::fs::write(&out, b"the previous output").unwrap();
        let s = |p: &Path| p.to_str().unwrap().to_string();
        let cases: Vec<(Vec<String>, u8, String)> = vec![
            (vec![s(&good), "--capacity".into(), "0".into()], 2, "capacity must be in 1..=2**31-1 (got \"0\")".into()),
            (
                vec![s(&good), "--capacity".into(), "-1".into()],
                2,
                "capacity must be in 1..=2**31-1 (got \"-1\")".into(),
            ),
            (
                vec![s(&good), "--capacity".into(), "2.5".into()],
                2,
                "capacity must be in 1..=2**31-1 (got \"2.5\")".into(),
            ),
            (
                vec![s(&good), "--capacity".into(), "2147483648".into()],
                2,
                "capacity must be in 1..=2**31-1 (got \"2147483648\")".into(),
            ),
            (
                vec![s(&good), "--capacity".into(), "4".into()],
                2,
                "column 'n' is not a list column (its type is Int64); name the list columns to pack with --columns".into(),
            ),
            (
                vec![s(&good), "--capacity".into(), "4".into(), "--columns".into(), "ids".into()],
                2,
                "column 'ids' is not in the table (its columns: ['input_ids', 'n', 'text'])".into(),
            ),
            (
                vec![s(&good), "--capacity".into(), "4".into(), "--columns".into(), "input_ids,input_ids".into()],
                2,
                "--columns must not repeat a name: 'input_ids' is named twice".into(),
            ),
            (
                // Spaces around a name are dropped: the same name twice.
                vec![s(&good), "--capacity".into(), "4".into(), "--columns".into(), "input_ids, input_ids ".into()],
                2,
                "--columns must not repeat a name: 'input_ids' is named twice".into(),
            ),
            (
                vec![s(&good), "--capacity".into(), "4".into(), "--columns".into(), "input_ids,".into()],
                2,
                "a column name is empty (--columns takes names separated by commas)".into(),
            ),
            (
                vec![s(&nulls), "--capacity".into(), "4".into(), "--columns".into(), "input_ids".into()],
                2,
                "column 'input_ids' has a null at row 3".into(),
            ),
            (
                vec![s(&empty), "--capacity".into(), "4".into(), "--columns".into(), "input_ids".into()],
                2,
                "the table is empty".into(),
            ),
            (
                vec![s(&two), "--capacity".into(), "4".into()],
                2,
                "column 'labels' does not have the offsets of column 'input_ids': row 1 has 4 values, not 3".into(),
            ),
            (
                vec![
                    s(&good),
                    "--capacity".into(),
                    "4".into(),
                    "--columns".into(),
                    "input_ids".into(),
                    "--overflow".into(),
                    "error".into(),
                ],
                1,
                "column 'input_ids' row 0 has 5 values, more than capacity = 4".into(),
            ),
            (
                vec![s(&good), "--capacity".into(), "4".into(), "--strategy".into(), "best".into()],
                2,
                "strategy must be 'bfd', 'ffd', 'next-fit', 'bfd_split' or 'wrapped' (got 'best')".into(),
            ),
            (
                vec![
                    s(&good),
                    "--capacity".into(),
                    "4".into(),
                    "--strategy".into(),
                    "wrapped".into(),
                    "--overflow".into(),
                    "drop".into(),
                ],
                2,
                "overflow does not apply to strategy 'wrapped'".into(),
            ),
            (vec![s(&text), "--capacity".into(), "4".into()], 2, "not an Arrow IPC file or stream".into()),
            (
                vec![s(&strings), "--capacity".into(), "4".into()],
                2,
                "column 'words' holds Dictionary(Int32, Utf8) values, which packing does not take (decode the dictionary first".into(),
            ),
            (
                vec![s(&dup), "--capacity".into(), "4".into()],
                2,
                "the table has duplicate column names: ['input_ids', 'input_ids']".into(),
            ),
        ];
        for (args, code, want) in cases {
            let mut all = vec!["pack-dataset".to_string(), args[0].clone(), s(&out)];
            all.extend(args[1..].iter().cloned());
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            let got = stowplan(&all);
            assert_eq!(got.status.code(), Some(i32::from(code)), "{args:?}: {}", stderr(&got));
            assert!(stderr(&got).contains(&want), "{args:?}: {}", stderr(&got));
            assert_eq!(std::fs::read(&out).unwrap(), b"the previous output", "{args:?}");
        }
        let mut names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "dup.arrow",
                "empty.arrow",
                "good.arrow",
                "lengths.txt",
                "nulls.arrow",
                "packed.arrow",
                "strings.arrow",
                "two.arrow"
            ]
        );
        // An OUT that cannot be written is refused before any work (no directory is made).
        let args = ["--capacity", "4", "--columns", "input_ids"];
        let got = pack_dataset(&good, &dir, &args);
        assert!(stderr(&got).contains("must name a file, not a directory"), "{}", stderr(&got));
        let got = pack_dataset(&good, &dir.join("missing").join("out.arrow"), &args);
        assert!(stderr(&got).contains("missing does not exist"), "{}", stderr(&got));
        assert!(!dir.join("missing").exists());
        // IN missing or a directory, and OUT that is IN (by its path or a hard link): refused
        // before any work, the input left as it was.
        let got = pack_dataset(&dir.join("nothing.arrow"), &out, &args);
        assert!(stderr(&got).contains("nothing.arrow\": No such file or directory"), "{}", stderr(&got));
        let got = pack_dataset(&dir, &out, &args);
        assert!(stderr(&got).contains("is a directory, not an Arrow IPC file"), "{}", stderr(&got));
        let good_bytes = std::fs::read(&good).unwrap();
        let link = dir.join("link.arrow");
        std::fs::hard_link(&good, &link).unwrap();
        for same in [&good, &link] {
            let got = pack_dataset(&good, same, &args);
            assert_eq!(got.status.code(), Some(2), "{}", stderr(&got));
            assert!(stderr(&got).contains("is the input file"), "{}", stderr(&got));
            assert_eq!(std::fs::read(&good).unwrap(), good_bytes);
        }
        std::fs::remove_file(&link).unwrap();
        // A damaged input is refused (or, where the damage is in the values, packed), never a crash.
        let bytes = std::fs::read(&good).unwrap();
        let damaged = dir.join("damaged.arrow");
        for i in (0..bytes.len()).step_by(11) {
            let mut copy = bytes.clone();
            copy[i] ^= 0x5a;
            std::fs::write(&damaged, &copy).unwrap();
            let got =
                pack_dataset(&damaged, &out, &["--capacity", "4", "--columns", "input_ids", "--backend", "native"]);
            assert!(matches!(got.status.code(), Some(0 | 2)), "byte {i}: {:?}: {}", got.status, stderr(&got));
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// SIGINT while `pack-dataset` writes: it stops at the next record batch, says so, exits
    /// 130 and leaves OUT as it was and no temporary file. The signal is sent as soon as the
    /// temporary file appears (the handler is installed before it is created); it races the
    /// gather of the one record batch (24M values), so a run that finished first must have
    /// written the whole table, and of up to 8 runs one must be interrupted.
    #[test]
    fn pack_dataset_stopped_by_sigint_leaves_the_output_as_it_was_and_no_temporary() {
        let dir = temp_dir("sigint");
        let input = dir.join("big.arrow");
        let n_rows = 60_000usize;
        let n: Vec<i64> = (0..n_rows as i64).collect();
        write(&input, false, &[batch(&vec![Some(400); n_rows], &n)]);
        let out = dir.join("packed.arrow");
        let before = b"the previous output";
        let temporaries = || -> Vec<String> {
            std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(".packed.arrow.tmp."))
                .collect()
        };
        let mut interrupted = 0;
        for _ in 0..8 {
            std::fs::write(&out, before).unwrap();
            let mut child = Command::new(env!("CARGO_BIN_EXE_stowplan"))
                .args(["pack-dataset", input.to_str().unwrap(), out.to_str().unwrap()])
                .args(["--capacity", "4096", "--columns", "input_ids"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let started = std::time::Instant::now();
            let exited = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break Some(status); // reaped: its pid must not be signalled any more
                }
                if !temporaries().is_empty() {
                    break None;
                }
                if started.elapsed().as_secs() >= 60 {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("pack-dataset never created its temporary file");
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            };
            if exited.is_none() {
                // SAFETY: kill(2) on the child's pid; the child has not been reaped yet (a
                // child that exited since is a zombie, which ignores the signal).
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
            }
            let output = child.wait_with_output().unwrap();
            assert!(temporaries().is_empty(), "a temporary file was left: {:?}", temporaries());
            if output.status.success() {
                // It finished before the signal: the whole table is there.
                assert_eq!(rows(&out, "seq_lengths").iter().map(Vec::len).sum::<usize>(), n_rows);
                continue;
            }
            assert_eq!(output.status.code(), Some(130), "stderr: {}", stderr(&output));
            assert!(stderr(&output).contains("interrupted:"), "stderr: {}", stderr(&output));
            assert!(stderr(&output).contains("not written"), "stderr: {}", stderr(&output));
            assert_eq!(std::fs::read(&out).unwrap(), before, "an interrupted run changed OUT");
            interrupted += 1;
            break;
        }
        assert_eq!(interrupted, 1, "SIGINT never arrived while pack-dataset was writing");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A structurally invalid file (list offsets that go backwards in one row, which a writer
    /// that trusts its arrays writes as they are) is refused naming the file, the column, the
    /// row (counted over the whole file) and the rule broken, by `plan` and `pack-dataset`.
    #[test]
    fn a_structurally_invalid_column_is_refused_naming_the_column_and_the_row() {
        use arrow_array::ListArray;
        let dir = temp_dir("invalid");
        let item = Arc::new(Field::new_list_field(DataType::Int32, true));
        let schema = Arc::new(Schema::new(vec![
            Field::new("input_ids", DataType::List(Arc::clone(&item)), true),
            Field::new("n", DataType::Int64, false),
        ]));
        let good = batch(&[Some(2), Some(1), Some(3)], &[2, 1, 3]).project(&[0, 1]).unwrap();
        // Rows 0..3 of the second batch: [0, 2), [2, 4), [4, 3) (backwards), [3, 6).
        let values = Arc::new(arrow_array::Int32Array::from(vec![1, 2, 3, 4, 5, 6]));
        // SAFETY: the array is only written to a file (as bytes), never read here.
        let broken = unsafe {
            arrow_data::ArrayData::builder(DataType::List(Arc::clone(&item)))
                .len(4)
                .add_buffer(arrow_buffer::Buffer::from_vec(vec![0i32, 2, 4, 3, 6]))
                .add_child_data(values.to_data())
                .build_unchecked()
        };
        let broken = ListArray::from(broken);
        let n = Arc::new(Int64Array::from(vec![2, 2, 0, 3]));
        // SAFETY: as above; the batch's columns have its length.
        let bad = unsafe { RecordBatch::new_unchecked(Arc::clone(&schema), vec![Arc::new(broken), n], 4) };
        for stream in [false, true] {
            let path = dir.join(if stream { "bad.stream.arrow" } else { "bad.file.arrow" });
            write(&path, stream, &[good.clone(), bad.clone()]);
            let shown = path.display().to_string();
            let out = plan_json(&path, &["--column", "input_ids"]);
            assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
            let err = stderr(&out);
            assert!(err.contains(&shown), "{err}");
            assert!(err.contains("column \"input_ids\", row 5 (from 0) (record batch 1)"), "{err}");
            assert!(err.contains("offset"), "the rule broken: {err}");
            let target = dir.join("packed.arrow");
            let args = ["pack-dataset", &shown, target.to_str().unwrap(), "--capacity", "8", "--columns", "input_ids"];
            let out = stowplan(&args);
            assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
            assert!(stderr(&out).contains("column \"input_ids\", row 5 (from 0)"), "{}", stderr(&out));
            assert!(!target.exists());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Under a file-size limit (`ulimit -f`) the write fails with EFBIG instead of SIGXFSZ
    /// killing the process: exit 2 naming the file, OUT as it was, no temporary file left.
    #[test]
    fn pack_dataset_past_the_file_size_limit_is_an_error_not_a_signal() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        let dir = temp_dir("fsize");
        let input = dir.join("in.arrow");
        let n_rows = 4_000usize;
        let n: Vec<i64> = (0..n_rows as i64).collect();
        write(&input, false, &[batch(&vec![Some(50); n_rows], &n)]);
        let out = dir.join("packed.arrow");
        std::fs::write(&out, b"the previous output").unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stowplan"));
        cmd.args(["pack-dataset", input.to_str().unwrap(), out.to_str().unwrap(), "--capacity", "512"]);
        cmd.args(["--columns", "input_ids"]);
        // SAFETY: setrlimit is async-signal-safe; the child only sets its own limit (64 KiB,
        // well below the packed table's 800 KB) before exec.
        unsafe {
            cmd.pre_exec(|| {
                let limit = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let output = cmd.output().unwrap();
        assert_eq!(output.status.signal(), None, "killed by a signal: {}", stderr(&output));
        assert_eq!(output.status.code(), Some(2), "stderr: {}", stderr(&output));
        assert!(stderr(&output).contains("File too large"), "stderr: {}", stderr(&output));
        assert!(stderr(&output).contains("packed.arrow"), "stderr: {}", stderr(&output));
        assert_eq!(std::fs::read(&out).unwrap(), b"the previous output");
        let mut names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["in.arrow", "packed.arrow"], "a temporary file was left");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// An output that is not a regular file (a device, a FIFO, a socket) is refused before
    /// any work and left as it was: renaming over it turned /dev/null into a regular file.
    #[test]
    fn pack_dataset_refuses_an_output_that_is_not_a_regular_file() {
        use std::os::unix::fs::FileTypeExt;
        let dir = temp_dir("special-out");
        let input = dir.join("in.arrow");
        write(&input, false, &[batch(&[Some(5), Some(2)], &[5, 2])]);
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let socket = dir.join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        for (target, what) in [
            (PathBuf::from("/dev/null"), "a character device"),
            (PathBuf::from("/dev/full"), "a character device"),
            (fifo.clone(), "a FIFO"),
            (socket.clone(), "a socket"),
        ] {
            let before = std::fs::symlink_metadata(&target).unwrap().file_type();
            let output = stowplan(&[
                "pack-dataset",
                input.to_str().unwrap(),
                target.to_str().unwrap(),
                "--capacity",
                "8",
                "--columns",
                "input_ids",
            ]);
            assert_eq!(output.status.code(), Some(2), "{}: {}", target.display(), stderr(&output));
            let err = stderr(&output);
            assert!(err.contains(&format!("{}: exists and is {what}", target.display())), "{err}");
            assert_eq!(
                std::fs::symlink_metadata(&target).unwrap().file_type(),
                before,
                "{} replaced",
                target.display()
            );
        }
        assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
