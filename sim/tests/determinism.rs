//! The same seed gives the same run, slice for slice; another seed another one.

use boundpool_sim::workload::RandomDag;
use boundpool_sim::{simulate, CostModel, Dist, KindCost, Machine, SimOptions};

fn spread_costs() -> CostModel {
    let mut m = CostModel::default();
    let mut light = KindCost::host(0.0);
    light.host = Dist::from_samples(&[10e-6, 12e-6, 15e-6, 40e-6]).unwrap();
    let mut heavy = KindCost::host(0.0);
    heavy.host = Dist::from_samples(&[40e-6, 45e-6, 60e-6, 200e-6]).unwrap();
    m.set("light", light).set("heavy", heavy);
    m
}

fn run(seed: u64) -> boundpool_sim::SimReport {
    let dag = RandomDag::new(600, 3, 11);
    let opts = SimOptions {
        seed,
        trace: true,
        ..SimOptions::default()
    };
    simulate(
        &dag.sim_graph(),
        &Machine::dev_host(3, 2),
        &spread_costs(),
        &opts,
    )
    .unwrap()
}

#[test]
fn same_seed_same_trace() {
    let (a, b) = (run(5), run(5));
    assert_eq!(a.makespan_s, b.makespan_s);
    assert_eq!(a.events, b.events);
    let (ta, tb) = (a.trace.unwrap(), b.trace.unwrap());
    assert_eq!(ta.tracks, tb.tracks);
    assert_eq!(ta.slices, tb.slices);
    assert!(ta.slices.len() > 600);
    let c = run(6);
    assert_ne!(c.trace.unwrap().slices, ta.slices);
}
