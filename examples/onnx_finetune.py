"""Fine-tune an ONNX model with opforge's own gradient rules: the digits CNN of demo.py goes out to ONNX, comes
back in, and trains.

1. Train the CNN briefly on half of the digit classes (0-4), export it to ONNX (checked by onnx.checker, run by
   ONNX Runtime when installed).
2. Load the ONNX file back as a module whose parameters are the model's initializers, and fine-tune it — compiled,
   backward pass appended as a program transformation — on all ten classes.
3. Check held-out accuracy before and after, and that the fine-tuned model exports again.

    python examples/onnx_finetune.py      # a few seconds; needs the onnx extra (pip install "opforge[onnx]")

Exits non-zero if the imported model does not reproduce the exported one, or fine-tuning misses 90% held-out
accuracy on ten classes.
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
from demo import make_model  # the digits CNN, with its custom isru op (which has an ONNX mapping)
from sklearn.datasets import load_digits

import opforge as of
from opforge import ops as F

SEED, BATCH, TARGET = 0, 64, 0.90


def train(model, images, labels, epochs, lr=5e-3):
    opt = of.optim.Adam(model.parameters(), lr=lr)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step = of.compile(step)
    loader = of.data.DataLoader(images, labels, batch_size=BATCH, shuffle=True, drop_last=True, seed=SEED)
    for _ in range(epochs):
        losses = [step(x, y).item() for x, y in loader]
    return float(np.mean(losses))


def accuracy(model, images, labels) -> float:
    with of.no_grad():
        return float((F.argmax(model(of.tensor(images)), axis=1).numpy() == labels).mean())


def main() -> int:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(labels))
    test, train_idx = order[:360], order[360:]
    half = train_idx[labels[train_idx] < 5]

    model = make_model()
    loss = train(model, images[half], labels[half], epochs=3)
    model.eval()
    before = accuracy(model, images[test], labels[test])
    print(f"1. trained on digits 0-4: loss {loss:.3f}, held-out accuracy on all ten digits {before:.1%}")

    path = Path(tempfile.mkdtemp()) / "digits_cnn.onnx"
    proto = of.onnx.export(model, path, of.Spec((None, 1, 8, 8), "float32"))
    print(f"   exported {path.name}: {len(proto.graph.node)} ONNX nodes, "
          f"{len(proto.graph.initializer)} initializers, opset {proto.opset_import[0].version}")
    try:
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        runtime = session.run(None, {"x": images[test]})[0]
        with of.no_grad():
            ours = model(of.tensor(images[test])).numpy()
        print(f"   ONNX Runtime agrees with opforge: max |difference| {np.abs(runtime - ours).max():.1e}")
    except ImportError:
        pass

    net = of.onnx.load_module(path)
    imported = accuracy(net, images[test], labels[test])
    print(f"2. loaded back: {len(list(net.parameters()))} trainable parameters "
          f"({', '.join(n for n, _ in net.named_parameters())}); held-out accuracy {imported:.1%}")
    loss = train(net, images[train_idx], labels[train_idx], epochs=6)
    after = accuracy(net, images[test], labels[test])
    print(f"   fine-tuned on all ten digits: loss {loss:.3f}, held-out accuracy {before:.1%} -> {after:.1%}")

    again = of.onnx.export(net, None, of.Spec((None, 1, 8, 8), "float32"))
    print(f"3. the fine-tuned model exports again: {len(again.graph.node)} ONNX nodes")
    ok = imported == before and after >= TARGET
    if not ok:
        print(f"FAILED: the import changed the accuracy ({before:.1%} -> {imported:.1%}) or fine-tuning missed "
              f"{TARGET:.0%}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
