use super::*;
use crate::comm::{Communicator, DType};
use crate::compute::cpu::CpuCompute;
use crate::compute::Compute;
use crate::layers::block::PhaseClock;
use crate::layers::run::RunOptions;

fn cfg(mode: Mode, shared: usize) -> MoeConfig {
    MoeConfig {
        hidden: 16,
        ffn: 8,
        experts: 8,
        topk: 2,
        shared,
        tokens: 32,
        mode,
        attention: None,
    }
}

fn host(dev: &CpuCompute, b: &crate::comm::HostBuffer) -> Vec<f32> {
    let mut v = vec![0f32; b.count(dev.dtype())];
    dev.download(b, &mut v).unwrap();
    v
}

#[test]
fn validation_names_what_does_not_fit() {
    let ep = MoeLayout::ep;
    let both = MoeLayout::of;
    assert!(cfg(Mode::Forward, 0).validate(ep(8)).is_ok());
    assert!(cfg(Mode::Forward, 0).validate(both(4, 8)).is_ok());
    let e = cfg(Mode::Forward, 0)
        .validate(ep(3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("8 experts"), "{e}");
    let e = cfg(Mode::Forward, 0)
        .validate(both(1, 3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("etp 3") && e.contains("ffn 8"), "{e}");
    assert!(cfg(Mode::Forward, 0).validate(both(1, 0)).is_err());
    let mut c = cfg(Mode::Forward, 0);
    c.topk = 9;
    assert!(c
        .validate(ep(1))
        .unwrap_err()
        .to_string()
        .contains("topk 9"));
    let mut c = cfg(Mode::Forward, 0);
    c.tokens = 30;
    assert!(c
        .validate(ep(4))
        .unwrap_err()
        .to_string()
        .contains("30 tokens"));
    c.tokens = 16;
    let e = c.validate(both(4, 8)).unwrap_err().to_string();
    assert!(e.contains("32 ranks") && e.contains("16 tokens"), "{e}");
    c.tokens = usize::MAX / 2;
    assert!(c.validate(ep(1)).is_err());
    c = cfg(Mode::Forward, 0);
    c.experts = 0;
    assert!(c.validate(ep(1)).is_err());
}

/// Every rank's shard of every tensor reassembles into the unsharded one,
/// and an expert-tensor rank holds its slice of each expert's gate and up
/// columns and of its down rows.
#[test]
fn shards_of_every_layout_reassemble_into_the_whole_tensors() {
    let c = cfg(Mode::Train, 1);
    let specs = MoeSpecs::new(&c);
    for layout in [(1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (8, 4)] {
        let layout = MoeLayout::of(layout.0, layout.1);
        for spec in specs.params().iter().chain([&specs.x, &specs.dy]) {
            let whole: Vec<f32> = (0..spec.len()).map(|i| spec.value(3, i)).collect();
            let shards: Vec<Vec<f32>> = (0..layout.world())
                .map(|r| specs.shard_values(spec, 3, layout, r))
                .collect();
            let got = specs.assemble(spec, layout, &shards).unwrap();
            assert_eq!(got, whole, "{} at {layout}", spec.name);
        }
    }
    // ep 2 etp 2, rank 3 (expert group 1, columns 4..8 of F = 8): expert
    // 4's first row's gate columns 4..8 then up columns 12..16.
    let l = MoeLayout::of(2, 2);
    let up: Vec<usize> = (0..8)
        .map(|i| specs.global_index(&specs.up, l, 3, i))
        .collect();
    let row = 4 * 16 * 16;
    assert_eq!(up, [4, 5, 6, 7, 12, 13, 14, 15].map(|c| row + c));
    // Its down rows: expert 4's rows 4..8, then expert 5's.
    let down_row = |i: usize| specs.global_index(&specs.down, l, 3, i * 16) / 16;
    assert_eq!(
        (0..8).map(down_row).collect::<Vec<_>>(),
        [36, 37, 38, 39, 44, 45, 46, 47]
    );
    assert_eq!(l.ep_group(3), vec![1, 3]);
    assert_eq!(l.etp_group(3), vec![2, 3]);
}

#[test]
fn top_k_breaks_ties_to_the_lower_expert_and_gates_sum_to_one() {
    let logits = [0.5, 2.0, 2.0, -1.0, 1.0, f32::NAN, 3.0, 3.0];
    let picks = top_k(&logits, 4, 2);
    assert_eq!(picks, vec![1, 2, 2, 3]);
    let r = Routing::new(&logits, 4, 2, picks.clone());
    assert!((r.gates[0] - 0.5).abs() < 1e-6 && (r.gates[1] - 0.5).abs() < 1e-6);
    assert_eq!(routing_gap(&logits[..4], 4, 2, &picks[..2]), 0.0);
    // Picking expert 0 (0.5) over expert 2 (2.0) is 1.5 off, over a scale of 2.
    assert!((routing_gap(&logits[..4], 4, 2, &[1, 0]) - 0.75).abs() < 1e-9);
}

#[test]
fn imbalance_is_max_over_mean() {
    assert_eq!(run::imbalance(&[2, 2, 2, 2]), 1.0);
    assert_eq!(run::imbalance(&[4, 2, 1, 1]), 2.0);
    assert_eq!(run::imbalance(&[]), 1.0);
}

/// The sharded block equals the unsharded one (forward and train, with and
/// without shared experts) at every expert-parallel degree that divides 8
/// experts, and with each expert's MLP split over 2 ranks beside them.
#[test]
fn sharded_block_matches_the_unsharded_one_on_local_ranks() {
    let layouts = [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2)];
    for (mode, shared) in [(Mode::Forward, 0), (Mode::Train, 1)] {
        for (ep, etp) in layouts {
            let c = cfg(mode, shared);
            let layout = MoeLayout::of(ep, etp);
            let o = checked_layout(c, layout);
            let want = if mode == Mode::Train { 8 } else { 2 };
            assert_eq!(o.check.as_ref().unwrap().tensors.len(), want);
            // Every copy is processed by each rank of its expert's group.
            assert_eq!(o.rows_per_rank.iter().sum::<usize>(), 32 * 2 * etp);
            assert!(o.imbalance() >= 1.0);
            if ep == 1 {
                assert_eq!(o.timing.a2a_us, 0.0);
            }
            if etp == 1 {
                assert_eq!(o.timing.etp_us, 0.0);
            } else {
                assert!(o.timing.etp_us > 0.0, "{layout}: {:?}", o.timing);
            }
            assert_eq!(o.timing.tp_us, 0.0);
        }
    }
}

/// Runs `c` at `layout` on local ranks with the check, which must pass.
fn checked_layout(c: MoeConfig, layout: MoeLayout) -> MoeOutcome {
    let outs = crate::layers::on_local_ranks(layout.world(), |comm| {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let opts = RunOptions {
            warmup: 0,
            iters: 1,
            check: true,
            seed: 9,
        };
        run_ep(&dev, comm, &c, layout, &opts).unwrap()
    });
    let o = outs.into_iter().next().unwrap();
    let check = o.check.as_ref().unwrap();
    assert!(check.passed(), "{layout} {}: {:?}", c.mode, check.tensors);
    o
}

/// The transformer layer (attention tensor-parallel over tp of the same
/// ranks, its replicas on their own sequences, then the MoE layer) equals
/// the unsharded layer, forward and train.
#[test]
fn attention_beside_the_moe_layer_matches_the_unsharded_layer() {
    let layouts = [
        (2, 1, 2),
        (2, 1, 1),
        (1, 2, 2),
        (2, 2, 2),
        (4, 1, 2),
        (2, 2, 4),
    ];
    for (mode, shared) in [(Mode::Forward, 0), (Mode::Train, 1)] {
        for (ep, etp, tp) in layouts {
            let layout = MoeLayout { ep, etp, tp };
            let o = checked_layout(with_attention(mode, shared), layout);
            // y (and routing); in train also dx, 5 MoE and 2 attention gradients.
            let want = if mode == Mode::Train { 10 } else { 2 };
            assert_eq!(o.check.as_ref().unwrap().tensors.len(), want);
            if tp > 1 {
                assert!(o.timing.tp_us > 0.0, "{layout}: {:?}", o.timing);
            }
        }
    }
    // Sizes that do not split are refused, naming what does not divide.
    let c = with_attention(Mode::Forward, 0);
    let e = c
        .validate(MoeLayout {
            ep: 2,
            etp: 1,
            tp: 3,
        })
        .unwrap_err();
    assert!(e.to_string().contains("tp 3"), "{e}");
    let e = c
        .validate(MoeLayout {
            ep: 8,
            etp: 1,
            tp: 1,
        })
        .unwrap_err();
    assert!(e.to_string().contains("4 sequences"), "{e}");
    let e = cfg(Mode::Forward, 0).validate(MoeLayout {
        ep: 2,
        etp: 1,
        tp: 2,
    });
    assert!(e.unwrap_err().to_string().contains("tp 2"));
}

/// The check's report after a forward at `layout` with tensor `which`
/// ([`MoeBlock::tensor_mut`]'s numbering) of rank 1 changed by `change`.
fn check_with_rank_1_changed(
    c: MoeConfig,
    layout: MoeLayout,
    which: usize,
    change: fn(&mut [f32]),
) -> crate::layers::CheckReport {
    let reports = crate::layers::on_local_ranks(layout.world(), |comm| {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let mut b = MoeBlock::new(&dev, &c, layout, comm.rank(), 5).unwrap();
        if comm.rank() == 1 {
            let w = b.tensor_mut(which);
            let mut v = host(&dev, w);
            change(&mut v);
            dev.upload(&v, w).unwrap();
        }
        b.forward(&dev, comm, &mut PhaseClock::new()).unwrap();
        check_moe(&dev, comm, &b, 5).unwrap()
    });
    reports.into_iter().next().unwrap()
}

/// A wrong expert weight on one rank is caught: with expert parallelism
/// alone, with one expert-tensor rank's slice wrong, and with one tensor
/// rank's slice of the attention's output projection wrong.
#[test]
fn the_check_fails_a_block_that_computes_something_else() {
    let bump: fn(&mut [f32]) = |v| v[3] += 0.5;
    let scale: fn(&mut [f32]) = |v| v.iter_mut().for_each(|x| *x *= 1.01);
    let forward = cfg(Mode::Forward, 0);
    let attention = with_attention(Mode::Forward, 0);
    for (c, layout, which, change) in [
        (forward, MoeLayout::ep(2), 2, scale),
        (forward, MoeLayout::of(1, 2), 1, bump),
        (
            attention,
            MoeLayout {
                ep: 2,
                etp: 1,
                tp: 2,
            },
            7,
            bump,
        ),
    ] {
        let report = check_with_rank_1_changed(c, layout, which, change);
        assert!(!report.passed(), "{layout}: {:?}", report.tensors);
    }
}

/// The layer with an attention before the MoE block: 4 heads over
/// sequences of 8 tokens (4 sequences a call).
fn with_attention(mode: Mode, shared: usize) -> MoeConfig {
    MoeConfig {
        attention: Some(MoeAttention { heads: 4, seq: 8 }),
        ..cfg(mode, shared)
    }
}

/// The unsharded backward's gradients against central differences of
/// loss = sum(dy * y), with the routing held fixed, for the MoE block
/// alone and after an attention.
#[test]
fn backward_matches_finite_differences() {
    let attention = Some(MoeAttention { heads: 2, seq: 3 });
    for attention in [None, attention] {
        backward_matches_finite_differences_of(MoeConfig {
            tokens: 6,
            attention,
            ..cfg(Mode::Train, 1)
        });
    }
}

fn backward_matches_finite_differences_of(c: MoeConfig) {
    crate::layers::on_local_ranks(1, |comm| {
        let dev = CpuCompute::new(DType::F32, 1).unwrap();
        let mut b = MoeBlock::new(&dev, &c, MoeLayout::SINGLE, 0, 3).unwrap();
        let mut clock = PhaseClock::new();
        b.forward(&dev, comm, &mut clock).unwrap();
        b.force_routing(b.picks().unwrap().to_vec()).unwrap();
        b.backward(&dev, comm, &mut clock).unwrap();
        let dy = MoeSpecs::new(&c).dy.shard_values(3, 1, 0);
        let loss = |b: &mut MoeBlock<CpuCompute>, comm: &mut crate::comm::LocalComm| -> f64 {
            b.forward(&dev, comm, &mut PhaseClock::new()).unwrap();
            let y = host(&dev, b.output());
            y.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let step = 1e-2f32;
        let tensors = if c.attention.is_some() { 8 } else { 6 };
        for which in 0..tensors {
            let analytic = match which {
                0..5 => host(&dev, &b.param_grads().unwrap()[which]),
                5 => host(&dev, b.input_grad().unwrap()),
                _ => host(&dev, &b.attention_grads().unwrap()[which - 6]),
            };
            let n = analytic.len();
            for i in (0..n).step_by((n / 7).max(1)) {
                let mut fd = 0f64;
                for sign in [1f32, -1.0] {
                    let mut v = host(&dev, b.tensor_mut(which));
                    let orig = v[i];
                    v[i] = orig + sign * step;
                    dev.upload(&v, b.tensor_mut(which)).unwrap();
                    fd += sign as f64 * loss(&mut b, comm);
                    v[i] = orig;
                    dev.upload(&v, b.tensor_mut(which)).unwrap();
                }
                fd /= 2.0 * step as f64;
                let err = (fd - analytic[i] as f64).abs();
                assert!(
                    err <= 2e-2 * fd.abs() + 2e-4,
                    "tensor {which} element {i}: analytic {} vs numeric {fd}",
                    analytic[i]
                );
            }
        }
    });
}

/// Forward and train at `layout` (`comm.world()` ranks) on `dtype`,
/// checked; with an attention before the MoE layer when `layout.tp > 1`.
fn checked_on<M>(comm: &mut M, layout: MoeLayout, dtype: DType) -> Vec<(Mode, f64)>
where
    M: Communicator<Buffer = crate::comm::HostBuffer>,
{
    let dev = CpuCompute::new(dtype, 1).unwrap();
    let opts = RunOptions {
        warmup: 0,
        iters: 1,
        check: true,
        seed: 11,
    };
    [(Mode::Forward, 0), (Mode::Train, 2)]
        .into_iter()
        .map(|(mode, shared)| {
            let c = match layout.tp {
                1 => cfg(mode, shared),
                _ => with_attention(mode, shared),
            };
            let o = run_ep(&dev, comm, &c, layout, &opts).unwrap();
            let c = o.check.unwrap();
            assert!(c.passed(), "{dtype} {mode}: {:?}", c.tensors);
            (mode, c.max_err)
        })
        .collect()
}

#[test]
fn bfloat16_storage_stays_within_its_tolerance() {
    crate::layers::on_local_ranks(4, |comm| checked_on(comm, MoeLayout::ep(4), DType::BF16));
    let l = MoeLayout::of(2, 2);
    crate::layers::on_local_ranks(4, |comm| checked_on(comm, l, DType::BF16));
}

/// The same check with every rank a process on the tcp backend, at EP 2,
/// 4 and 8, at EP 2 x ETP 2, and with the attention at TP 2 beside EP 2
/// (the test binary re-run as the ranks of a job; the role names the
/// expert-tensor and attention degrees).
#[test]
fn sharded_block_matches_the_unsharded_one_on_tcp() {
    const NAME: &str = "layers::moe::tests::sharded_block_matches_the_unsharded_one_on_tcp";
    const ROLE: &str = "PARBENCH_MOE_TEST_ETP";
    if let Ok(etp) = std::env::var(ROLE) {
        let info = crate::rendezvous::RankInfo::from_env()
            .expect("launch variables")
            .expect("a rank");
        let mut comm = crate::comm::tcp::comm(
            &info,
            crate::comm::Algo::Auto,
            std::time::Duration::from_secs(60),
        )
        .expect("tcp ranks");
        let (etp, tp) = etp.split_once(':').expect("etp:tp");
        let etp: usize = etp.parse().expect("an expert-tensor degree");
        let tp: usize = tp.parse().expect("an attention degree");
        let layout = MoeLayout {
            ep: comm.world() / etp,
            etp,
            tp,
        };
        checked_on(&mut comm, layout, DType::F32);
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    for (world, etp, tp) in [(2, 1, 1), (4, 1, 1), (8, 1, 1), (4, 2, 1), (2, 1, 2)] {
        let status = crate::launch::LocalJob::new(
            world,
            &exe,
            [NAME, "--exact", "--nocapture", "--test-threads=1"],
        )
        .env(ROLE, format!("{etp}:{tp}"))
        .run();
        assert!(
            status.is_ok_and(|s| s.success()),
            "tcp {world} ranks, etp {etp} tp {tp}"
        );
    }
}
