#!/usr/bin/env python3
"""Writes the action lists of every schedule torch.distributed.pipelining
ships, as PyTorch's own classes build them, for parbench's generator tests
(parbench/tests/pytorch_schedules.rs).

Each class is built with mock stages (plain objects carrying the stage
index, the rank and the sizes the constructors read; nothing runs and no
process group starts), the way PyTorch's own schedule tests build them, and
its compute-only order (`pipeline_order`) is written as PyTorch's
compute-only CSV: one row per rank, one cell per step, an empty cell for an
idle step, `str(action)` for an action (`2F0`, `1I3`; DualPipeV's
overlapped pair as `(0F3;7B0)OVERLAP_F_B`), the form
`_PipelineScheduleRuntime._dump_csv(format="compute_only")` writes. GPipe
and 1F1B (single-stage classes) give their order through
`_get_pipeline_order()`, which also lists REDUCE_GRAD bookkeeping actions;
only compute actions and idle steps are kept.

manifest.json records the torch version, and per file the class, R, M,
stages per rank and PyTorch's stage-to-rank map (`stage_index_to_group_rank`);
a size the class refuses is listed with PyTorch's message instead of a file.

Usage: python scripts/pytorch_schedules.py OUT_DIR   (needs torch: pip install torch)
"""

import csv
import json
import os
import sys
import types

import torch
import torch.distributed.pipelining.schedules as sch

RANKS = (2, 4)
MICROBATCHES = (4, 8, 16)

# parbench's name, PyTorch's class, stages per rank (None: single-stage class).
SCHEDULES = (
    ("gpipe", sch.ScheduleGPipe, None),
    ("1f1b", sch.Schedule1F1B, None),
    ("interleaved", sch.ScheduleInterleaved1F1B, 2),
    ("looped-bfs", sch.ScheduleLoopedBFS, 2),
    ("interleaved-zb", sch.ScheduleInterleavedZeroBubble, 2),
    ("zb-v", sch.ScheduleZBVZeroBubble, 2),
    ("dualpipev", sch.ScheduleDualPipeV, 2),
)


class MockStage:
    """What the schedule constructors read from a stage, and nothing else."""

    def __init__(self, stage_index, num_stages, rank, ranks):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_rank = rank
        self.group_size = ranks
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.submod = torch.nn.Identity()
        self.stage_index_to_group_rank = {}
        self.args_recv_info = {0: ()}
        self.act_send_info = {}


def v_stages(rank, ranks):
    return (rank, 2 * ranks - 1 - rank)


def build(cls, per_rank, ranks, micro):
    """The schedule as rank 0 builds it (every rank computes every rank's order)."""
    if per_rank is None:
        return cls(MockStage(0, ranks, 0, ranks), micro)
    num_stages = ranks * per_rank
    if cls in (sch.ScheduleZBVZeroBubble, sch.ScheduleDualPipeV):
        indices = v_stages(0, ranks)
    else:
        indices = range(0, num_stages, ranks)
    stages = [MockStage(s, num_stages, 0, ranks) for s in indices]
    return cls(stages, micro)


def compute_only(order):
    """Compute actions and idle steps of each rank, PyTorch's cells."""
    rows = []
    for rank in sorted(order):
        row = []
        for a in order[rank]:
            if a is None:
                row.append("")
            elif a.is_compute_op:
                row.append(str(a))
        rows.append(row)
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: pytorch_schedules.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    files = []
    for name, cls, per_rank in SCHEDULES:
        for ranks in RANKS:
            for micro in MICROBATCHES:
                try:
                    s = build(cls, per_rank, ranks, micro)
                except ValueError as e:
                    # PyTorch refuses these sizes: parbench must refuse them too.
                    files.append(
                        {
                            "schedule": name,
                            "class": cls.__name__,
                            "ranks": ranks,
                            "microbatches": micro,
                            "refused": str(e),
                        }
                    )
                    continue
                rows = compute_only(s.pipeline_order)
                path = f"{name}-R{ranks}-M{micro}.csv"
                with open(os.path.join(out, path), "w", newline="") as f:
                    csv.writer(f).writerows(rows)
                mapping = getattr(s, "stage_index_to_group_rank", None) or {
                    r: r for r in range(ranks)
                }
                files.append(
                    {
                        "file": path,
                        "schedule": name,
                        "class": cls.__name__,
                        "ranks": ranks,
                        "microbatches": micro,
                        "stages_per_rank": per_rank or 1,
                        "stage_to_rank": [mapping[k] for k in sorted(mapping)],
                    }
                )
    manifest = {
        "torch": torch.__version__,
        "written_by": "scripts/pytorch_schedules.py",
        "files": files,
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
