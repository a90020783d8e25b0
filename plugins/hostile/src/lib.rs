//! `hostile`: a test fixture that misbehaves on purpose, to prove the sandbox. The config's
//! `mode` picks the misbehaviour:
//!
//! - `loop`: spins forever (the host's deadline or fuel must stop it);
//! - `memory`: allocates without end (the host's memory limit must stop it);
//! - `huge-result`: returns a list of 2^28 positions (the allocation hits the memory limit);
//! - `panic`: panics (a trap with the panic message on stderr);
//! - `exit`: calls `exit(3)` (WASI 0.2 carries only success or failure: the host sees 1);
//! - `out-of-range`, `duplicate`, `too-many`: returns an invalid selection;
//! - `huge-output`: prints 16 MiB to stdout and stderr, then answers FIFO;
//! - `sleep`: sleeps an hour (the fixed clock makes it return at once), then answers FIFO;
//! - `probe`: tries files, environment, clocks, randomness and the network and reports what it
//!   saw as its error text;
//! - `count`: counts calls in a global and answers `err("call N")`, except that every third
//!   call panics (shows an instance is reused while it works and replaced after a trap: the
//!   count restarts at 1);
//! - anything else: FIFO.

use std::hint::black_box;
use stowplan_filter_guest::{Buffer, Context, Guest, fifo};

struct Hostile;

static mut CALLS: u64 = 0;

fn mode(config: &str) -> String {
    serde_json::from_str::<serde_json::Value>(config)
        .ok()
        .and_then(|v| v.get("mode").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or_default()
}

fn probe() -> String {
    let file = match std::fs::read("/etc/passwd") {
        Ok(b) => format!("read {} bytes", b.len()),
        Err(e) => format!("denied ({e})"),
    };
    let dir = match std::fs::read_dir(".") {
        Ok(_) => "listed".to_string(),
        Err(e) => format!("denied ({e})"),
    };
    let env = std::env::vars().count();
    let args = std::env::args().count();
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let start = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(5));
    let slept = start.elapsed().as_nanos();
    let net = match std::net::TcpStream::connect("127.0.0.1:9") {
        Ok(_) => "connected".to_string(),
        Err(e) => format!("denied ({e})"),
    };
    let mut random = [0u8; 8];
    let random = match getrandom(&mut random) {
        true => format!("{random:?}"),
        false => "none".to_string(),
    };
    format!(
        "file={file}; dir={dir}; env={env}; args={args}; wall_ns={wall}; slept_ns={slept}; net={net}; random={random}"
    )
}

fn getrandom(buf: &mut [u8]) -> bool {
    // std's HashMap keys come from the WASI random source.
    use std::hash::{BuildHasher, RandomState};
    let h = RandomState::new().hash_one(0u8);
    buf.copy_from_slice(&h.to_le_bytes());
    true
}

impl Guest for Hostile {
    fn select(ctx: Context, buffer: Buffer) -> Result<Vec<u32>, String> {
        let calls = unsafe {
            CALLS += 1;
            CALLS
        };
        let n = buffer.groups() as u32;
        match mode(&ctx.config).as_str() {
            "loop" => {
                let mut x = 0u64;
                loop {
                    x = black_box(x.wrapping_add(1));
                }
            }
            "memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "huge-result" => Ok(black_box(vec![0u32; 1 << 28])),
            "panic" => panic!("hostile plugin panics on purpose (call {calls})"),
            "exit" => std::process::exit(3),
            "out-of-range" => Ok(vec![n]),
            "duplicate" => Ok(vec![0, 0]),
            "too-many" => Ok((0..n).chain(0..1).take(ctx.wanted as usize + 1).collect()),
            "huge-output" => {
                let line = "x".repeat(1023);
                for _ in 0..(16 << 10) {
                    println!("{line}");
                    eprintln!("{line}");
                }
                Ok(fifo(&ctx, &buffer))
            }
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                Ok(fifo(&ctx, &buffer))
            }
            "probe" => Err(probe()),
            "count" => {
                if calls % 3 == 0 {
                    panic!("call {calls} of this instance traps");
                }
                Err(format!("call {calls}"))
            }
            _ => Ok(fifo(&ctx, &buffer)),
        }
    }
}

stowplan_filter_guest::export_filter!(Hostile);
