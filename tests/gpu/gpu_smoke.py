"""Load the smoke models on a GPU with the payload's loader and compare with the references."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "imgbuild" / "payload"))

import smoke  # noqa: E402  (the in-image payload, stdlib at import)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return 1
    cap = torch.cuda.get_device_capability(0)
    facts = {"archs": [f"sm{cap[0]}{cap[1]}"]}
    rows = []
    for m in args.models:
        t = time.perf_counter()
        status, reason, details = smoke.check_gpu(m, facts, "transformers", "require")
        rows.append({"model": m.name, "status": status, "reason": reason,
                     "seconds": round(time.perf_counter() - t, 2), "details": details})
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "sm": facts["archs"][0],
                                    "torch": torch.__version__, "results": rows}, indent=2))
    for r in rows:
        print(f"{r['status']:8} {r['model']:22} {r['seconds']:6.2f}s  {r['reason']}")
    return 0 if all(r["status"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
