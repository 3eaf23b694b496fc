// W1 peer rust_arc: std::sync::Arc, Rust's shared handle. One op =
// Arc::clone of the Arc the benchmark holds (a retain) and dropping the clone
// (a release). std only; builds with Debian 12's rustc 1.63 (no
// std::hint::black_box there: an empty asm! block hides the pointer instead).
//   w1a  one thread, n ops per repetition
//   w1b  two threads, n ops each on the same Arc, released together by a
//        Barrier; the time from the first start to the last end, divided by n
// value = the median over reps of ns per op, after a warm-up of n/10 ops.
// Build: rustc -C opt-level=2 --edition 2021 w1_arc.rs -o w1_arc
// Run:   ./w1_arc [n=10000000] [reps=5]
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// The optimiser must assume `p` is read and memory may change.
#[inline(always)]
fn escape<T>(p: *const T) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "x86"))]
    unsafe {
        std::arch::asm!("/* {0} */", in(reg) p, options(nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "x86")))]
    unsafe {
        std::ptr::read_volatile(&p);
    }
}

#[inline(never)]
fn clone_drop(held: &Arc<[u8; 64]>, n: u64) {
    for _ in 0..n {
        escape(held as *const Arc<[u8; 64]>);
        let copy = Arc::clone(held);
        escape(&copy as *const Arc<[u8; 64]>);
        drop(copy);
    }
}

fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let k = v.len() / 2;
    if v.len() % 2 == 1 {
        v[k]
    } else {
        (v[k - 1] + v[k]) / 2.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).filter(|&x| x > 0).unwrap_or(10_000_000);
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).filter(|&x| x > 0).unwrap_or(5);
    let held = Arc::new([0u8; 64]);

    clone_drop(&held, n / 10);
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        clone_drop(&held, n);
        t.push(t0.elapsed().as_nanos() as f64 / n as f64);
    }
    println!(
        "peer=rust_arc workload=w1a size=0 metric=ns_per_op value={:.3} n={} reps={}",
        median_of(t),
        n,
        reps
    );

    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let gate = Barrier::new(2);
        let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        gate.wait();
                        let a = Instant::now();
                        clone_drop(&held, n);
                        (a, Instant::now())
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("worker")).collect()
        });
        let first = spans.iter().map(|s| s.0).min().expect("two");
        let last = spans.iter().map(|s| s.1).max().expect("two");
        t.push((last - first).as_nanos() as f64 / n as f64);
    }
    println!(
        "peer=rust_arc workload=w1b size=0 metric=ns_per_op value={:.3} n={} reps={}",
        median_of(t),
        n,
        reps
    );
    if Arc::strong_count(&held) != 1 {
        eprintln!("w1_arc: strong_count {}, not 1", Arc::strong_count(&held));
        std::process::exit(1);
    }
}
