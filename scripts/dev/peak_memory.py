"""What is alive at a training step's peak memory: benchmarks/train.py's llama (or mlp) case
on CUDA, for eager, torch.compile and keraunos.jit. Replays the CUDA caching allocator's
history (torch.cuda.memory._record_memory_history) of one step, finds the moment of the most
bytes allocated and lists the blocks alive then, largest first, each with the program line
that allocated it (for keraunos, the line of its generated forward or backward program).

  python scripts/dev/peak_memory.py [--case llama|mlp] [--top 20] [--kinds keraunos,compile]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import torch  # noqa: E402
import train  # noqa: E402

import keraunos  # noqa: E402


def sources(run):
    out = {}
    try:
        for t in keraunos.last_traces(run):
            src = getattr(t, "source", None)
            if src and src.startswith("def "):
                name = src.split("(", 1)[0][4:]
                out[f"<keraunos {name}>"] = src.splitlines()
    except Exception:
        pass
    return out


def where(frames, srcs):
    for f in frames:
        fn = f.get("filename", "")
        if fn in srcs:
            lines = srcs[fn]
            ln = f.get("line", 0)
            text = lines[ln - 1].strip() if 0 < ln <= len(lines) else "?"
            return f"{fn}:{ln}  {text}"
    for f in frames:
        fn = f.get("filename", "")
        if fn.endswith(".py") and "site-packages" not in fn and "/torch/" not in fn:
            return f"{Path(fn).name}:{f.get('line')} {f.get('name')}"
    return frames[0]["filename"] + ":" + str(frames[0].get("line")) if frames else "?"


def peak(events):
    live, total, best, best_live = {}, 0, -1, {}
    for e in events:
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif a == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
        if total > best:
            best, best_live = total, dict(live)
    return best, best_live


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="llama")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--kinds", default="eager,compile,keraunos")
    a = ap.parse_args()
    dev = torch.device("cuda")
    fn, params, args, label = train.CASES[a.case](dev, torch.bfloat16, False)
    print(f"# {a.case}: {label}")
    for kind in a.kinds.split(","):
        run = train.runner(kind, fn)
        train.step(run, params, args)
        # What a step leaves allocated besides the parameters' gradients (held between steps).
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=200000)
        train.step(run, params, args)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        grads = {p.grad.data_ptr() for p in params if p.grad is not None}
        kept = {}
        for e in snap["device_traces"][0]:
            if e["action"] == "alloc":
                kept[e["addr"]] = e
            elif e["action"] == "free_completed":
                kept.pop(e["addr"], None)
        kept = [e for a, e in kept.items() if a not in grads]
        srcs = sources(run) if kind == "keraunos" else {}
        held = sum(e["size"] for e in kept)
        print(f"\n## {kind}: a step leaves {held / 2**20:.1f} MiB allocated besides the gradients")
        for e in sorted(kept, key=lambda e: -e["size"])[:8]:
            print(f"  {e['size'] / 2**20:9.1f} MiB  {where(e.get('frames', []), srcs)}")
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=200000)
        train.step(run, params, args)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = snap["device_traces"][0]
        best, live = peak(events)
        srcs = sources(run) if kind == "keraunos" else {}
        print(
            f"\n## {kind}: peak extra {best / 2**30:.3f} GiB over the step (base {base / 2**30:.2f} GiB)"
        )
        rows = sorted(live.values(), key=lambda e: -e["size"])[: a.top]
        for e in rows:
            print(f"  {e['size'] / 2**20:9.1f} MiB  {where(e.get('frames', []), srcs)}")


if __name__ == "__main__":
    main()
