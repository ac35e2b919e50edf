use qwen_bpf::{Backend, Model, ModelOptions};
fn main() {
    let threads: usize = std::env::var("T").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let backend = Backend::from_name(&std::env::var("B").unwrap_or("q24".into())).unwrap();
    let t0 = std::time::Instant::now();
    let mut m = Model::open("/tmp/q06", &ModelOptions { max_context: 64, progress: true, threads, backend, ..Default::default() }).unwrap();
    eprintln!("open {:.2}s mem {:?}", t0.elapsed().as_secs_f64(), m.kernel_memory());
    let mut tok = 785u32;
    let t1 = std::time::Instant::now();
    let r0 = m.bpf_runs();
    for _ in 0..16 { tok = m.next_token(tok).unwrap(); }
    let dt = t1.elapsed().as_secs_f64() / 16.0;
    eprintln!("{} threads {threads}: {:.1} ms/token, {} runs/token", backend.name(), dt * 1e3, (m.bpf_runs() - r0) / 16);
    if std::env::var("STATS").is_ok() {
        let out = std::process::Command::new("bpftool").args(["prog", "show"]).output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        for l in s.lines().filter(|l| l.contains("run_time_ns")) { eprintln!("{l}"); }
    }
}
