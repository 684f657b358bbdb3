//! One rank's shard of the MoE block: its experts and the replicated router
//! and shared experts on a compute device, its tokens, and the forward and
//! backward with the all-to-alls between them.
//!
//! The matrix products run on the device; the element-wise parts (top-k
//! softmax, SwiGLU, gate scaling, the permutation of rows by expert and
//! their sum) run on the host between them, through the device's download
//! and upload (a copy on the CPU; on a GPU a transfer that the compute time
//! includes: parbench has no MoE kernels yet). Every figure stays in the
//! storage type where a GPU would store it (the rows sent, every product's
//! operands and results).

use super::super::block::PhaseClock;
use super::super::layout::TensorSpec;
use super::super::{LayerError, LayerResult, Mode};
use super::attention::TpAttention;
use super::etp::EtpShares;
use super::exchange::{exchange_counts_in, exchange_rows_in, wait_for_peers, Group};
use super::layout::{MoeLayout, MoeSpecs};
use super::routing::{top_k, Routing};
use super::MoeConfig;
use crate::comm::Communicator;
use crate::compute::{Compute, Gemm};
use std::cell::Cell;
use std::time::Duration;

/// What the forward leaves for the backward.
struct Saved<B> {
    routing: Routing,
    plan: Dispatch,
    /// The rows each local expert got in the whole expert-tensor group,
    /// grouped by expert (`n_g x h`).
    expert_in: B,
    /// Their gate and up projections, this rank's columns (host, `n_g x 2F/etp`).
    expert_h: Vec<f32>,
    /// SwiGLU of those (`n_g x F/etp`).
    expert_act: B,
    /// Each routed copy's expert output, in send order (`n k x h`).
    back: Vec<f32>,
    /// The shared experts' gate and up projections (host, `n x 2 S F`).
    shared_h: Vec<f32>,
    /// SwiGLU of those (`n x S F`).
    shared_act: B,
}

/// Where each token's copies go and how many rows cross each pair; peers
/// are indexed in the expert-parallel group (one per expert group).
#[derive(Clone, Debug)]
struct Dispatch {
    /// `(token, slot)` of each row sent, by destination peer, then local
    /// expert, then token.
    order: Vec<(usize, usize)>,
    /// Rows sent to `[peer][local expert]`.
    send: Vec<Vec<usize>>,
    /// Rows received from `[peer][local expert]`.
    recv: Vec<Vec<usize>>,
    /// The rows of each local expert on each rank of the expert-tensor group.
    etp: EtpShares,
}

impl Dispatch {
    fn rows_to(&self, peer: usize) -> usize {
        self.send[peer].iter().sum()
    }
    fn rows_from(&self, peer: usize) -> usize {
        self.recv[peer].iter().sum()
    }
    /// Rows this rank received in the dispatch.
    fn local_rows(&self) -> usize {
        self.recv.iter().flatten().sum()
    }
    /// Rows received per local expert.
    fn per_expert(&self, el: usize) -> Vec<usize> {
        (0..el)
            .map(|le| self.recv.iter().map(|c| c[le]).sum())
            .collect()
    }
    /// Rows local expert `le` processes (its whole expert-tensor group's).
    fn expert_rows(&self, le: usize) -> usize {
        self.etp.rows(le)
    }
}

/// Rank `rank`'s shard of an MoE block split as `layout` on device `C`.
pub struct MoeBlock<C: Compute> {
    cfg: MoeConfig,
    layout: MoeLayout,
    rank: usize,
    /// This rank's place in its expert-parallel group.
    ep_rank: usize,
    /// The ranks this one exchanges tokens with (its expert-parallel group).
    ep_group: Vec<usize>,
    /// The ranks sharing its experts (its expert-tensor group).
    etp_group: Vec<usize>,
    /// Tokens of this rank.
    n: usize,
    /// Experts of this rank.
    el: usize,
    /// Each expert's MLP columns on this rank (`F / etp`).
    fl: usize,
    /// Router, up, down, shared up, shared down.
    params: [C::Buf; 5],
    grads: Option<[C::Buf; 5]>,
    x: C::Buf,
    dy: Option<C::Buf>,
    y: C::Buf,
    dx: Option<C::Buf>,
    /// Experts picked for each token, given instead of the router's own
    /// choice (the unsharded check follows the sharded run's picks).
    forced: Option<Vec<usize>>,
    saved: Option<Saved<C::Buf>>,
    /// Rows this rank's experts processed in the last forward.
    received: usize,
    /// Rows this rank sent to other ranks in the last forward's dispatch.
    sent_away: usize,
    /// Time in the expert-tensor group's exchanges, since the block was
    /// built (also in the clocks' communication).
    etp_spent: Cell<Duration>,
    /// The attention before the MoE layer, if the block has one.
    attention: Option<TpAttention<C>>,
    /// The MoE layer's input when there is an attention before it (its
    /// output); else the MoE layer reads `x`.
    moe_x: Option<C::Buf>,
    /// Time in the attention's tensor-group exchanges, as `etp_spent`.
    tp_spent: Cell<Duration>,
}

/// A seeded tensor's shard on the device.
fn shard<C: Compute>(
    dev: &C,
    specs: &MoeSpecs,
    spec: &TensorSpec,
    seed: u64,
    layout: MoeLayout,
    rank: usize,
) -> LayerResult<C::Buf> {
    let mut b = dev.alloc(specs.local_len(spec, layout))?;
    dev.upload(&specs.shard_values(spec, seed, layout, rank), &mut b)?;
    Ok(b)
}

/// `C = op(A) op(B)` with offsets and leading dimensions; `beta` 0.
#[allow(clippy::too_many_arguments)]
fn product(
    (m, n, k): (usize, usize, usize),
    (trans_a, a_offset, lda): (bool, usize, usize),
    (trans_b, b_offset, ldb): (bool, usize, usize),
    c_offset: usize,
) -> Gemm {
    Gemm {
        trans_a,
        a_offset,
        lda,
        trans_b,
        b_offset,
        ldb,
        c_offset,
        ..Gemm::dense(m, n, k)
    }
}

fn host<C: Compute>(dev: &C, b: &C::Buf, len: usize) -> LayerResult<Vec<f32>> {
    let mut v = vec![0f32; len];
    dev.download(b, &mut v)?;
    Ok(v)
}

fn device<C: Compute>(dev: &C, v: &[f32]) -> LayerResult<C::Buf> {
    let mut b = dev.alloc(v.len())?;
    dev.upload(v, &mut b)?;
    Ok(b)
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SwiGLU of `rows` rows of `[gate | up]` (`2f` wide): `silu(gate) * up`.
fn swiglu(h: &[f32], rows: usize, f: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * f];
    for (o, r) in out
        .chunks_exact_mut(f.max(1))
        .zip(h.chunks_exact(2 * f.max(1)))
    {
        let (g, u) = r.split_at(f);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g * sigmoid(g) * u;
        }
    }
    out
}

/// The gradient of SwiGLU's input from its output's (`da`).
fn swiglu_backward(h: &[f32], da: &[f32], rows: usize, f: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * 2 * f];
    for ((o, r), d) in out
        .chunks_exact_mut(2 * f.max(1))
        .zip(h.chunks_exact(2 * f.max(1)))
        .zip(da.chunks_exact(f.max(1)))
    {
        let (g, u) = r.split_at(f);
        let (dg, du) = o.split_at_mut(f);
        for i in 0..f {
            let s = sigmoid(g[i]);
            let silu = g[i] * s;
            du[i] = d[i] * silu;
            dg[i] = d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        }
    }
    out
}

impl<C: Compute> MoeBlock<C> {
    /// Builds rank `rank`'s shard of `cfg`'s block split as `layout`, with
    /// weights, input and output gradient seeded by `seed`.
    pub fn new(
        dev: &C,
        cfg: &MoeConfig,
        layout: MoeLayout,
        rank: usize,
        seed: u64,
    ) -> LayerResult<Self> {
        cfg.validate(layout)?;
        if rank >= layout.world() {
            return Err(LayerError::Config(format!("rank {rank} of {layout}")));
        }
        let specs = MoeSpecs::new(cfg);
        let load = |s: &TensorSpec| shard(dev, &specs, s, seed, layout, rank);
        let [a, b, c, d, e] = specs.params();
        let params = [load(&a)?, load(&b)?, load(&c)?, load(&d)?, load(&e)?];
        let train = cfg.mode == Mode::Train;
        let grads = if train {
            let z = |s: &TensorSpec| dev.alloc(specs.local_len(s, layout));
            Some([z(&a)?, z(&b)?, z(&c)?, z(&d)?, z(&e)?])
        } else {
            None
        };
        let n = cfg.local_tokens(layout.world());
        let attention = TpAttention::new(dev, cfg, layout, rank, seed)?;
        Ok(MoeBlock {
            cfg: *cfg,
            layout,
            rank,
            ep_rank: layout.ep_rank(rank),
            ep_group: layout.ep_group(rank),
            etp_group: layout.etp_group(rank),
            n,
            el: cfg.local_experts(layout.ep),
            fl: cfg.ffn / layout.etp,
            params,
            grads,
            x: load(&specs.x)?,
            dy: if train { Some(load(&specs.dy)?) } else { None },
            y: dev.alloc(n * cfg.hidden)?,
            dx: if train {
                Some(dev.alloc(n * cfg.hidden)?)
            } else {
                None
            },
            forced: None,
            saved: None,
            received: 0,
            sent_away: 0,
            etp_spent: Cell::new(Duration::ZERO),
            attention,
            moe_x: None,
            tp_spent: Cell::new(Duration::ZERO),
        })
    }

    /// Routes every token to `picks` (`tokens x topk` experts) instead of
    /// the router's own top-k; the gates still come from the router.
    pub fn force_routing(&mut self, picks: Vec<usize>) -> LayerResult<()> {
        if picks.len() != self.n * self.cfg.topk || picks.iter().any(|&e| e >= self.cfg.experts) {
            return Err(LayerError::Config(format!(
                "forced routing: {} picks for {} tokens of top-{} over {} experts",
                picks.len(),
                self.n,
                self.cfg.topk,
                self.cfg.experts
            )));
        }
        self.forced = Some(picks);
        Ok(())
    }

    pub fn config(&self) -> &MoeConfig {
        &self.cfg
    }

    /// The layout and this rank.
    pub fn shard_of(&self) -> (MoeLayout, usize) {
        (self.layout, self.rank)
    }

    /// Time spent in the expert-tensor group's exchanges since the block
    /// was built (part of the clocks' communication time).
    pub fn etp_comm(&self) -> Duration {
        self.etp_spent.get()
    }

    /// Time spent in the attention's tensor-group exchanges, as [`MoeBlock::etp_comm`].
    pub fn tp_comm(&self) -> Duration {
        self.tp_spent.get()
    }

    /// The attention's weight gradients (`w_qkv`, `w_o`: this rank's heads,
    /// summed over its replica's tokens), after [`MoeBlock::backward`];
    /// `None` without an attention or outside training.
    pub fn attention_grads(&self) -> Option<&[C::Buf; 2]> {
        self.attention.as_ref()?.param_grads()
    }

    /// This rank's expert-tensor group and its time's account.
    fn etp(&self) -> Group<'_> {
        Group {
            ranks: &self.etp_group,
            spent: &self.etp_spent,
        }
    }

    /// What the MoE layer reads: the attention's output, or the block's input.
    fn moe_input(&self) -> &C::Buf {
        self.moe_x.as_ref().unwrap_or(&self.x)
    }

    /// The output `y` of this rank's tokens.
    pub fn output(&self) -> &C::Buf {
        &self.y
    }

    /// The gradient of this rank's input, after [`MoeBlock::backward`].
    pub fn input_grad(&self) -> Option<&C::Buf> {
        self.dx.as_ref()
    }

    /// This rank's parameter gradients (router, up, down, shared up, shared
    /// down, as [`MoeSpecs::grads`]), after [`MoeBlock::backward`].
    pub fn param_grads(&self) -> Option<&[C::Buf; 5]> {
        self.grads.as_ref()
    }

    /// The experts each of this rank's tokens went to in the last forward
    /// (`tokens x topk`).
    pub fn picks(&self) -> Option<&[usize]> {
        self.saved.as_ref().map(|s| s.routing.experts.as_slice())
    }

    /// Rows this rank's expert shards processed in the last forward (its
    /// expert group's share of the routed token copies: the load the
    /// imbalance is made of).
    pub fn rows_received(&self) -> usize {
        self.received
    }

    /// Rows this rank sent to other ranks in the last forward's dispatch.
    pub fn rows_sent_away(&self) -> usize {
        self.sent_away
    }

    /// The router's logits of this rank's tokens (`tokens x E`), from the
    /// MoE layer's input (with an attention before it: after a forward).
    pub fn router_logits(&self, dev: &C) -> LayerResult<Vec<f32>> {
        let (n, h, e) = (self.n, self.cfg.hidden, self.cfg.experts);
        let mut logits = dev.alloc(n * e)?;
        dev.gemm(
            &Gemm::dense(n, e, h),
            self.moe_input(),
            &self.params[0],
            &mut logits,
        )?;
        host(dev, &logits, n * e)
    }

    /// Parameter `i` (router, up, down, shared up, shared down), the input
    /// at `i == 5`, the attention's `w_qkv` and `w_o` at 6 and 7: for the
    /// finite-difference test.
    #[cfg(test)]
    pub(super) fn tensor_mut(&mut self, i: usize) -> &mut C::Buf {
        match (i, self.attention.as_mut()) {
            (0..=4, _) => &mut self.params[i],
            (6 | 7, Some(a)) => a.param_mut(i - 6),
            _ => &mut self.x,
        }
    }

    /// Which rank holds expert `e`, and its index there.
    fn home(&self, e: usize) -> (usize, usize) {
        (e / self.el, e % self.el)
    }

    /// The dispatch plan of `routing` (its receive counts still empty).
    fn plan(&self, routing: &Routing) -> Dispatch {
        let k = self.cfg.topk;
        let mut slots: Vec<Vec<Vec<(usize, usize)>>> =
            vec![vec![Vec::new(); self.el]; self.layout.ep];
        for (i, &e) in routing.experts.iter().enumerate() {
            let (peer, le) = self.home(e);
            slots[peer][le].push((i / k, i % k));
        }
        let send = slots
            .iter()
            .map(|p| p.iter().map(Vec::len).collect())
            .collect();
        let order = slots.into_iter().flatten().flatten().collect();
        Dispatch {
            order,
            send,
            recv: Vec::new(),
            etp: EtpShares::default(),
        }
    }

    /// Rows received per peer (grouped by local expert within each) into
    /// one buffer grouped by local expert, then by peer.
    fn group(&self, plan: &Dispatch, per_peer: &[Vec<f32>], width: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(plan.local_rows() * width);
        for le in 0..self.el {
            for (peer, rows) in per_peer.iter().enumerate() {
                let start: usize = plan.recv[peer][..le].iter().sum();
                let len = plan.recv[peer][le];
                out.extend_from_slice(&rows[start * width..(start + len) * width]);
            }
        }
        out
    }

    /// The inverse of [`MoeBlock::group`]: rows grouped by expert back into
    /// one block per peer, in the order that peer sent them.
    fn ungroup(&self, plan: &Dispatch, grouped: &[f32], width: usize) -> Vec<Vec<f32>> {
        let mut out: Vec<Vec<f32>> = (0..self.layout.ep)
            .map(|p| Vec::with_capacity(plan.rows_from(p) * width))
            .collect();
        let mut at = 0;
        for le in 0..self.el {
            for (peer, o) in out.iter_mut().enumerate() {
                let len = plan.recv[peer][le] * width;
                o.extend_from_slice(&grouped[at..at + len]);
                at += len;
            }
        }
        out
    }

    /// Rows in send order (`order`'s rows, each `width` wide from
    /// `row(token, slot)`) cut into one block per destination.
    fn per_peer(&self, plan: &Dispatch, rows: &[f32], width: usize) -> Vec<Vec<f32>> {
        let mut at = 0;
        (0..self.layout.ep)
            .map(|p| {
                let len = plan.rows_to(p) * width;
                let v = rows[at..at + len].to_vec();
                at += len;
                v
            })
            .collect()
    }

    /// Sends rows to the experts' ranks (dispatch direction) or back
    /// (combine direction), after waiting for every peer.
    fn exchange<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        plan: &Dispatch,
        send: Vec<Vec<f32>>,
        to_experts: bool,
    ) -> LayerResult<Vec<Vec<f32>>>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let recv = recv_lens(plan, self.cfg.hidden, to_experts);
        if self.layout.ep > 1 {
            wait_for_peers(dev, comm, clock)?;
        }
        exchange_rows_in(dev, comm, clock, &self.ep_group, send, &recv)
    }

    /// The rows this rank received (grouped by local expert) and those of
    /// the rest of its expert-tensor group: every row its experts' shards run on.
    fn gather_group<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        plan: &Dispatch,
        mine: Vec<f32>,
    ) -> LayerResult<Vec<f32>>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        plan.etp
            .gather(dev, comm, clock, self.etp(), mine, self.cfg.hidden)
    }

    /// This rank's rows of the group's partial results, summed over the
    /// expert-tensor group (the row-parallel product's reduction).
    fn reduce_group<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        plan: &Dispatch,
        all: Vec<f32>,
    ) -> LayerResult<Vec<f32>>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        plan.etp
            .scatter_sum(dev, comm, clock, self.etp(), all, self.cfg.hidden)
    }

    /// The experts' gated MLPs (this rank's columns of each) on rows
    /// grouped by local expert: one product per expert over all its rows.
    /// Returns (up projections on the host, SwiGLU on the device, outputs
    /// on the host: partial sums over the expert-tensor group).
    fn experts_forward(
        &self,
        dev: &C,
        plan: &Dispatch,
        input: &C::Buf,
    ) -> LayerResult<(Vec<f32>, C::Buf, Vec<f32>)> {
        let (h, f) = (self.cfg.hidden, self.fl);
        let rows = plan.etp.total();
        let mut up = dev.alloc(rows * 2 * f)?;
        let mut r0 = 0;
        for le in 0..self.el {
            let m = plan.expert_rows(le);
            if m > 0 {
                let g = product(
                    (m, 2 * f, h),
                    (false, r0 * h, h),
                    (false, le * h * 2 * f, 2 * f),
                    r0 * 2 * f,
                );
                dev.gemm(&g, input, &self.params[1], &mut up)?;
            }
            r0 += m;
        }
        let up_h = host(dev, &up, rows * 2 * f)?;
        let act = device(dev, &swiglu(&up_h, rows, f))?;
        let mut out = dev.alloc(rows * h)?;
        let mut r0 = 0;
        for le in 0..self.el {
            let m = plan.expert_rows(le);
            if m > 0 {
                let g = product(
                    (m, h, f),
                    (false, r0 * f, f),
                    (false, le * f * h, h),
                    r0 * h,
                );
                dev.gemm(&g, &act, &self.params[2], &mut out)?;
            }
            r0 += m;
        }
        Ok((up_h, act, host(dev, &out, rows * h)?))
    }

    /// The shared experts on this rank's tokens: (up projections, SwiGLU,
    /// output), or empty when there are none.
    fn shared_forward(&self, dev: &C) -> LayerResult<(Vec<f32>, C::Buf, Vec<f32>)> {
        let (n, h) = (self.n, self.cfg.hidden);
        let sf = self.cfg.shared * self.cfg.ffn;
        if sf == 0 {
            return Ok((Vec::new(), dev.alloc(0)?, Vec::new()));
        }
        let mut up = dev.alloc(n * 2 * sf)?;
        dev.gemm(
            &Gemm::dense(n, 2 * sf, h),
            self.moe_input(),
            &self.params[3],
            &mut up,
        )?;
        let up_h = host(dev, &up, n * 2 * sf)?;
        let act = device(dev, &swiglu(&up_h, n, sf))?;
        let mut out = dev.alloc(n * h)?;
        dev.gemm(&Gemm::dense(n, h, sf), &act, &self.params[4], &mut out)?;
        Ok((up_h, act, host(dev, &out, n * h)?))
    }

    /// One forward: route, dispatch, experts, combine, shared experts and
    /// the residual. Collective over the block's `ep` ranks.
    pub fn forward<M>(&mut self, dev: &C, comm: &mut M, clock: &mut PhaseClock) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let (n, h, e, k) = (self.n, self.cfg.hidden, self.cfg.experts, self.cfg.topk);
        if let Some(attention) = self.attention.as_mut() {
            let x = host(dev, &self.x, n * h)?;
            let y1 = attention.forward(dev, comm, clock, &self.tp_spent, &x)?;
            self.moe_x = Some(device(dev, &y1)?);
        }
        let logits = self.router_logits(dev)?;
        let picks = match &self.forced {
            Some(p) => p.clone(),
            None => top_k(&logits, e, k),
        };
        let routing = Routing::new(&logits, e, k, picks);
        let mut plan = self.plan(&routing);
        let x = host(dev, self.moe_input(), n * h)?;
        let rows: Vec<f32> = plan
            .order
            .iter()
            .flat_map(|&(t, _)| x[t * h..(t + 1) * h].iter().copied())
            .collect();
        let send = self.per_peer(&plan, &rows, h);
        if self.layout.ep > 1 {
            wait_for_peers(dev, comm, clock)?;
            plan.recv = exchange_counts_in(comm, &self.ep_group, &plan.send)?;
            clock.end_comm(comm)?;
        } else {
            plan.recv = plan.send.clone();
        }
        plan.etp = EtpShares::exchange(comm, clock, self.etp(), plan.per_expert(self.el))?;
        let recv = recv_lens(&plan, h, true);
        let got = exchange_rows_in(dev, comm, clock, &self.ep_group, send, &recv)?;
        let mine = self.group(&plan, &got, h);
        let expert_in = device(dev, &self.gather_group(dev, comm, clock, &plan, mine)?)?;
        let (expert_h, expert_act, out) = self.experts_forward(dev, &plan, &expert_in)?;
        let out = self.reduce_group(dev, comm, clock, &plan, out)?;
        let back = self.ungroup(&plan, &out, h);
        let back = self
            .exchange(dev, comm, clock, &plan, back, false)?
            .concat();
        let (shared_h, shared_act, shared_out) = self.shared_forward(dev)?;
        let mut y = x.clone();
        for (i, &(t, j)) in plan.order.iter().enumerate() {
            let g = routing.gates[t * k + j];
            for (yv, bv) in y[t * h..(t + 1) * h]
                .iter_mut()
                .zip(&back[i * h..(i + 1) * h])
            {
                *yv += g * bv;
            }
        }
        for (yv, s) in y.iter_mut().zip(&shared_out) {
            *yv += s;
        }
        dev.upload(&y, &mut self.y)?;
        self.received = plan.etp.total();
        self.sent_away = (0..self.layout.ep)
            .filter(|&p| p != self.ep_rank)
            .map(|p| plan.rows_to(p))
            .sum();
        self.saved = Some(Saved {
            routing,
            plan,
            expert_in,
            expert_h,
            expert_act,
            back,
            shared_h,
            shared_act,
        });
        clock.end_compute(dev)
    }

    /// One backward from the seeded output gradient, after
    /// [`MoeBlock::forward`]: every parameter's gradient (overwritten) and
    /// the input's. Collective over the block's `ep` ranks.
    pub fn backward<M>(&mut self, dev: &C, comm: &mut M, clock: &mut PhaseClock) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let not_train = || LayerError::Config("backward needs a block built in train mode".into());
        let (n, h, e, k, f) = (
            self.n,
            self.cfg.hidden,
            self.cfg.experts,
            self.cfg.topk,
            self.fl,
        );
        let sf = self.cfg.shared * self.cfg.ffn;
        let saved = self
            .saved
            .take()
            .ok_or_else(|| LayerError::Config("backward before forward".into()))?;
        let (Some(dy_buf), Some(mut grads), Some(mut dx_buf)) =
            (self.dy.as_ref(), self.grads.take(), self.dx.take())
        else {
            self.saved = Some(saved);
            return Err(not_train());
        };
        let r = self.backward_with(
            dev,
            comm,
            clock,
            &saved,
            dy_buf,
            &mut grads,
            &mut dx_buf,
            (n, h, e, k, f, sf),
        );
        self.grads = Some(grads);
        self.saved = Some(saved);
        if let (Ok(()), Some(attention)) = (&r, self.attention.as_mut()) {
            // The MoE layer's input gradient is the attention's output's.
            let dy1 = host(dev, &dx_buf, n * h)?;
            let dx = attention.backward(dev, comm, clock, &self.tp_spent, &dy1)?;
            dev.upload(&dx, &mut dx_buf)?;
            clock.end_compute(dev)?;
        }
        self.dx = Some(dx_buf);
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_with<M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        s: &Saved<C::Buf>,
        dy_buf: &C::Buf,
        grads: &mut [C::Buf; 5],
        dx_buf: &mut C::Buf,
        (n, h, e, k, f, sf): (usize, usize, usize, usize, usize, usize),
    ) -> LayerResult<()>
    where
        M: Communicator<Buffer = C::Buf>,
    {
        let [g_router, g_up, g_down, g_sup, g_sdown] = grads;
        let plan = &s.plan;
        let dy = host(dev, dy_buf, n * h)?;
        // The routed copies' output gradients (gate x dy) and the gates' own.
        let mut dgates = vec![0f32; n * k];
        let mut rows = Vec::with_capacity(plan.order.len() * h);
        for (i, &(t, j)) in plan.order.iter().enumerate() {
            let g = s.routing.gates[t * k + j];
            let d = &dy[t * h..(t + 1) * h];
            rows.extend(d.iter().map(|v| g * v));
            dgates[t * k + j] = d
                .iter()
                .zip(&s.back[i * h..(i + 1) * h])
                .map(|(a, b)| a * b)
                .sum();
        }
        let send = self.per_peer(plan, &rows, h);
        let got = self.exchange(dev, comm, clock, plan, send, true)?;
        let mine = self.group(plan, &got, h);
        let d_out = device(dev, &self.gather_group(dev, comm, clock, plan, mine)?)?;
        let rows_here = plan.etp.total();
        // The experts' backward, one product per expert and weight.
        let mut d_act = dev.alloc(rows_here * f)?;
        let mut r0 = 0;
        for le in 0..self.el {
            let m = plan.expert_rows(le);
            if m > 0 {
                let g = product((m, f, h), (false, r0 * h, h), (true, le * f * h, h), r0 * f);
                dev.gemm(&g, &d_out, &self.params[2], &mut d_act)?;
            }
            // dW_down = act^T d_out (k = 0 zeroes an expert that got no rows).
            let g = product((f, h, m), (true, r0 * f, f), (false, r0 * h, h), le * f * h);
            dev.gemm(&g, &s.expert_act, &d_out, g_down)?;
            r0 += m;
        }
        let d_act_h = host(dev, &d_act, rows_here * f)?;
        let d_up = device(dev, &swiglu_backward(&s.expert_h, &d_act_h, rows_here, f))?;
        let mut d_in = dev.alloc(rows_here * h)?;
        let mut r0 = 0;
        for le in 0..self.el {
            let m = plan.expert_rows(le);
            let g = product(
                (h, 2 * f, m),
                (true, r0 * h, h),
                (false, r0 * 2 * f, 2 * f),
                le * h * 2 * f,
            );
            dev.gemm(&g, &s.expert_in, &d_up, g_up)?;
            if m > 0 {
                let g = product(
                    (m, h, 2 * f),
                    (false, r0 * 2 * f, 2 * f),
                    (true, le * h * 2 * f, 2 * f),
                    r0 * h,
                );
                dev.gemm(&g, &d_up, &self.params[1], &mut d_in)?;
            }
            r0 += m;
        }
        let d_in_h = host(dev, &d_in, rows_here * h)?;
        let d_in_h = self.reduce_group(dev, comm, clock, plan, d_in_h)?;
        let back = self.ungroup(plan, &d_in_h, h);
        let d_rows = self.exchange(dev, comm, clock, plan, back, false)?.concat();

        // The input gradient: residual, routed copies, router, shared experts.
        let mut dx = dy.clone();
        for (i, &(t, _)) in plan.order.iter().enumerate() {
            for (a, b) in dx[t * h..(t + 1) * h]
                .iter_mut()
                .zip(&d_rows[i * h..(i + 1) * h])
            {
                *a += b;
            }
        }
        let d_logits = device(dev, &s.routing.logit_grads(&dgates, e))?;
        let x_dev = self.moe_input();
        dev.gemm(
            &product((h, e, n), (true, 0, h), (false, 0, e), 0),
            x_dev,
            &d_logits,
            g_router,
        )?;
        let mut dx_part = dev.alloc(n * h)?;
        dev.gemm(
            &product((n, h, e), (false, 0, e), (true, 0, e), 0),
            &d_logits,
            &self.params[0],
            &mut dx_part,
        )?;
        let mut add = |part: &C::Buf| -> LayerResult<()> {
            for (a, b) in dx.iter_mut().zip(host(dev, part, n * h)?) {
                *a += b;
            }
            Ok(())
        };
        add(&dx_part)?;
        if sf > 0 {
            let mut d_sact = dev.alloc(n * sf)?;
            dev.gemm(
                &product((n, sf, h), (false, 0, h), (true, 0, h), 0),
                dy_buf,
                &self.params[4],
                &mut d_sact,
            )?;
            dev.gemm(
                &product((sf, h, n), (true, 0, sf), (false, 0, h), 0),
                &s.shared_act,
                dy_buf,
                g_sdown,
            )?;
            let d_sact_h = host(dev, &d_sact, n * sf)?;
            let d_sup = device(dev, &swiglu_backward(&s.shared_h, &d_sact_h, n, sf))?;
            dev.gemm(
                &product((h, 2 * sf, n), (true, 0, h), (false, 0, 2 * sf), 0),
                x_dev,
                &d_sup,
                g_sup,
            )?;
            dev.gemm(
                &product((n, h, 2 * sf), (false, 0, 2 * sf), (true, 0, 2 * sf), 0),
                &d_sup,
                &self.params[3],
                &mut dx_part,
            )?;
            add(&dx_part)?;
        }
        dev.upload(&dx, dx_buf)?;
        clock.end_compute(dev)
    }
}

/// Elements received from each peer: rows to the experts (dispatch), or
/// back from them (combine).
fn recv_lens(plan: &Dispatch, h: usize, to_experts: bool) -> Vec<usize> {
    (0..plan.send.len())
        .map(|p| {
            h * if to_experts {
                plan.rows_from(p)
            } else {
                plan.rows_to(p)
            }
        })
        .collect()
}
