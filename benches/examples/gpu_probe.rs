//! Self-test of a GPU machine (`boundpool_workloads::probe`): `gpu_probe [--sticky] [--baselines]`.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sticky = args.iter().any(|a| a == "--sticky");
    let base = args.iter().any(|a| a == "--baselines");
    if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
        println!("no GPU: {why}");
        return;
    }
    if base {
        use boundpool_workloads as b;
        match b::call_costs(0, 20_000) {
            Ok((l, r, q)) => println!("call costs ns: launch {l:.0}, record {r:.0}, query {q:.0}"),
            Err(e) => println!("call_costs: {e}"),
        }
        for k in [1usize, 2, 4, 8, 16] {
            match b::raw_launches(0, k, 20_000) {
                Ok(m) => println!("raw k={k}: {:.0} launches/s", m.rate()),
                Err(e) => println!("raw k={k}: {e}"),
            }
        }
        match b::thread_per_task(0, 2000) {
            Ok(m) => println!("thread per task: {:.0}/s", m.rate()),
            Err(e) => println!("tpt: {e}"),
        }
        match b::server_thread(0, 8, 80_000) {
            Ok(m) => println!("server thread (8 submitters): {:.0}/s", m.rate()),
            Err(e) => println!("server: {e}"),
        }
        match b::event_edge_chain(0, 20_000) {
            Ok(m) => println!("event edge chain: {:.2} us/edge", m.micros_per_op()),
            Err(e) => println!("edge: {e}"),
        }
        match b::host_sync_edge_chain(0, 20_000) {
            Ok(m) => println!("host sync edge chain: {:.2} us/edge", m.micros_per_op()),
            Err(e) => println!("hedge: {e}"),
        }
    }
    match boundpool_workloads::probe(0, sticky) {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
        }
        Err(e) => {
            println!("probe failed: {e}");
            std::process::exit(1);
        }
    }
}
