from nbhelp import Book


def build() -> Book:
    b = Book("dl")
    b.md("""
    # Chapter 11 — Deep learning: nn, optim, state, datasets

    Everything so far — tensors, autograd, fusion, code generation, the JIT — comes together here
    in the way tinygrad users write models:

    - a **layer** is a plain Python object holding Tensors, with a `__call__`; there is no Module
      base class. `nn.state.get_parameters(model)` finds the parameters by walking attributes;
    - an **optimizer** step is one more lazy graph: it builds every new parameter and `assign`s it,
      so `step()` is a handful of kernels and a JIT captures it like any other function;
    - a **state dict** names every tensor by its path (`l1.weight`) and saves to safetensors;
    - **datasets**: `nn.datasets.digits()` gives scikit-learn's 8×8 digits offline.

    At the end we train a small network on digits with `TinyJit`, plot its loss and check its test
    accuracy — in a few seconds, on a CPU.

    Modules: [`tinyteach/nn/__init__.py`](../tinyteach/nn/__init__.py) (layers),
    [`nn/optim.py`](../tinyteach/nn/optim.py), [`nn/state.py`](../tinyteach/nn/state.py),
    [`nn/datasets.py`](../tinyteach/nn/datasets.py); a script version of the training loop (with
    a CNN) is [`examples/train_digits.py`](../examples/train_digits.py).
    """)
    b.setup('''
    import matplotlib.pyplot as plt
    from tqdm.notebook import tqdm

    from tinyteach import TinyJit, nn
    from tinyteach.nn.state import get_parameters, get_state_dict, load_state_dict
    ''')
    b.md("""
    ## Layers are objects that hold Tensors

    `nn.Linear(64, 32)` holds a weight (32, 64) and a bias (32,), drawn uniformly from
    ±1/√64 as PyTorch and tinygrad do. Calling it is `x @ weight.T + bias`:
    """)
    b.code('''
    layer = nn.Linear(64, 32)
    x = Tensor(rng.standard_normal((5, 64)).astype(np.float32))
    print("weight", layer.weight.shape, "bias", layer.bias.shape, "->", layer(x).shape)
    assert np.abs(layer.weight.numpy()).max() <= 1 / 8
    np.testing.assert_allclose(layer(x).numpy(),
                               x.numpy() @ layer.weight.numpy().T + layer.bias.numpy(), rtol=1e-4,
                               atol=1e-5)
    ''')
    b.md("""
    A model is any object whose attributes (or lists, dicts) hold layers. A two-layer perceptron
    for 8×8 images:
    """)
    b.code('''
    class MLP:
        def __init__(self, hidden: int = 64):
            self.l1 = nn.Linear(64, hidden)
            self.l2 = nn.Linear(hidden, 10)

        def __call__(self, images: Tensor) -> Tensor:
            return self.l2(self.l1(images.flatten(1)).relu())


    Tensor.manual_seed(0)
    model = MLP()
    Tensor.realize(*get_parameters(model))  # draw the initial weights now
    state = get_state_dict(model)
    for name, tensor in state.items():
        print(f"{name:10} {tensor.shape}")
    print(sum(t.numel() for t in get_parameters(model)), "parameters")
    ''')
    b.md("""
    ## Optimizers: a step is a lazy graph too

    `SGD`, `Adam`, `AdamW` and `LAMB` take the parameters and a learning rate. `zero_grad()` forgets
    old gradients, `backward()` builds the new ones, and `step()` realizes every updated parameter
    (and the optimizer's own state) together. Gradients exist only in training mode
    (`Tensor.train()`). Minimize `(w - 3)²` with SGD:
    """)
    b.code('''
    w = Tensor([0.0])
    sgd = nn.optim.SGD([w], lr=0.1)
    with Tensor.train():
        for _ in range(20):
            sgd.zero_grad()
            ((w - 3) ** 2).sum().backward()
            sgd.step()
    print(f"w after 20 steps: {w.item():.4f}")
    assert abs(w.item() - 3) < 0.05
    ''')
    b.md("""
    One Adam step on the model, seen through `%%tinyteach`: a whole forward, backward and update
    becomes a few dozen fused kernels.
    """)
    b.code('''
    %%tinyteach --show kernels
    adam = nn.optim.Adam(get_parameters(model), lr=1e-2)
    images = Tensor(rng.random((64, 1, 8, 8)).astype(np.float32))
    labels = Tensor(rng.integers(0, 10, 64).astype(np.int32))
    with Tensor.train():
        adam.zero_grad()
        model(images).sparse_categorical_crossentropy(labels).backward()
        adam.step()
    ''')
    b.md("""
    ## State dicts: names, saving, loading

    `get_state_dict` names tensors by their path; `safe_save` writes the safetensors format (a
    JSON header, then raw bytes — nothing is unpickled on load); `load_state_dict` checks every
    name and shape before assigning. Copy the model's weights into a fresh one:
    """)
    b.code('''
    import tempfile
    from pathlib import Path

    from tinyteach.nn.state import safe_load, safe_save

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "mlp.safetensors"
        safe_save(get_state_dict(model), path)
        loaded = safe_load(path)
    copy = MLP()
    load_state_dict(copy, loaded)
    probe = Tensor(rng.random((3, 1, 8, 8)).astype(np.float32))
    np.testing.assert_allclose(copy(probe).numpy(), model(probe).numpy(), rtol=1e-6)
    print("loaded", sorted(loaded), "- the copy computes the same outputs")
    ''')
    b.md("""
    A wrong shape is reported by name, before anything is overwritten:
    """)
    b.code('''
    try:
        load_state_dict(MLP(hidden=32), loaded)
    except Exception as error:
        print(type(error).__name__ + ":", error)
    ''')
    b.md("""
    ## The data: 8×8 digits, offline

    `nn.datasets.digits()` returns the 1,797 images bundled with scikit-learn, scaled to [0, 1],
    with a fixed split: the images in a fixed shuffled order, 1,500 for training and 297 for
    testing.
    """)
    b.code('''
    X_train, Y_train, X_test, Y_test = nn.datasets.digits()
    print(X_train.shape, X_train.dtype, Y_train.shape, Y_train.dtype, X_test.shape)
    x_train, y_train = X_train.numpy(), Y_train.numpy()
    x_test, y_test = X_test.numpy(), Y_test.numpy()
    assert x_train.shape == (1500, 1, 8, 8) and 0 <= x_train.min() and x_train.max() <= 1

    figure, axes = plt.subplots(1, 8, figsize=(8, 1.3))
    for axis, image, label in zip(axes, x_train[:8], y_train[:8]):
        axis.imshow(image[0], cmap="gray_r")
        axis.set_title(int(label))
        axis.axis("off")
    plt.show()
    ''')
    b.md("""
    ## Training with `TinyJit`

    The step — forward, loss, backward, Adam update — is captured on its second call and replayed
    afterwards (chapter 10). Batches are drawn on the host with a seeded numpy generator and
    passed in as arguments, so each replay sees new data. The progress bar is tqdm's notebook
    widget; the numbers we keep are printed at the end.
    """)
    b.code('''
    Tensor.manual_seed(1)  # another seed than the model above: a fresh set of weights
    batches = np.random.default_rng(0)
    model = MLP(hidden=64)
    optimizer = nn.optim.Adam(get_parameters(model), lr=1e-2)


    @TinyJit
    def train_step(images: Tensor, labels: Tensor) -> Tensor:
        with Tensor.train():
            optimizer.zero_grad()
            loss = model(images).sparse_categorical_crossentropy(labels).backward()
            optimizer.step()
            return loss.realize()


    STEPS, BATCH = 300, 64
    losses = []
    progress = tqdm(range(STEPS), desc="training")
    for step in progress:
        chosen = batches.integers(0, len(x_train), BATCH)
        loss = train_step(Tensor(x_train[chosen]), Tensor(y_train[chosen]))
        losses.append(loss.item())
        if step % 50 == 0:
            progress.set_postfix(loss=f"{losses[-1]:.3f}")
    print(f"{STEPS} steps; loss {np.mean(losses[:20]):.3f} (first 20) -> "
          f"{np.mean(losses[-20:]):.3f} (last 20); {len(train_step.captured.launches)} kernels "
          "per step")
    assert np.mean(losses[-20:]) < 0.3 * np.mean(losses[:20])
    ''')
    b.code('''
    plt.figure(figsize=(6, 3))
    plt.plot(losses, alpha=0.4, label="per step")
    smooth = np.convolve(losses, np.ones(20) / 20, mode="valid")
    plt.plot(np.arange(19, STEPS), smooth, label="mean of 20")
    plt.xlabel("step")
    plt.ylabel("cross-entropy")
    plt.yscale("log")
    plt.legend()
    plt.show()
    ''')
    b.md("""
    ## Test accuracy

    Evaluation is a plain forward pass on the 297 held-out images (no `Tensor.train()`, so no
    gradients are built):
    """)
    b.code('''
    predictions = model(Tensor(x_test)).argmax(axis=1).numpy()
    accuracy = (predictions == y_test).mean()
    print(f"test accuracy: {accuracy:.1%}")
    assert accuracy > 0.85
    ''')
    b.md("""
    Which digits does it confuse? A few test images with the model's guesses:
    """)
    b.code('''
    wrong = np.flatnonzero(predictions != y_test)[:8]
    print("misclassified (true -> predicted):",
          [f"{int(y_test[i])}->{int(predictions[i])}" for i in wrong])
    ''')
    b.md("## Try it")
    b.exercise("SGD with momentum", """
        Train a fresh `MLP` for 100 steps with `nn.optim.SGD(..., lr=0.1, momentum=0.9)` instead of
        Adam (reuse the loop above, without the progress bar). How does its test accuracy compare?
        """, '''
        def train(make_optimizer, steps=100, seed=2):
            Tensor.manual_seed(seed)
            draw = np.random.default_rng(seed)
            net = MLP()
            opt = make_optimizer(get_parameters(net))

            @TinyJit
            def step_fn(images, labels):
                with Tensor.train():
                    opt.zero_grad()
                    loss = net(images).sparse_categorical_crossentropy(labels).backward()
                    opt.step()
                    return loss.realize()

            for _ in range(steps):
                chosen = draw.integers(0, len(x_train), BATCH)
                step_fn(Tensor(x_train[chosen]), Tensor(y_train[chosen]))
            return (net(Tensor(x_test)).argmax(axis=1).numpy() == y_test).mean()

        sgd_accuracy = train(lambda params: nn.optim.SGD(params, lr=0.1, momentum=0.9))
        print(f"SGD with momentum, 100 steps: {sgd_accuracy:.1%}")
        assert sgd_accuracy > 0.6
        ''')
    b.exercise("how many kernels per step?", """
        The JIT replays `len(train_step.captured.launches)` kernels per step. Draw the captured
        schedule with `viz.schedule(...)` and find the kernel of the first layer's matmul.
        """, '''
        names = [launch.item.name for launch in train_step.captured.launches]
        print(len(names), "kernels;", [n for n in names if n.startswith("r_64_64")])
        viz.schedule(train_step.captured.launches[:6])
        ''')
    b.exercise("save the trained model", """
        Save the trained `model` with `safe_save`, load it into a new `MLP`, and check that it has
        the same test accuracy.
        """, '''
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "trained.safetensors"
            safe_save(get_state_dict(model), path)
            restored = MLP()
            load_state_dict(restored, safe_load(path))
        restored_accuracy = (restored(Tensor(x_test)).argmax(axis=1).numpy() == y_test).mean()
        print(f"restored model: {restored_accuracy:.1%}")
        assert restored_accuracy == accuracy
        ''')
    return b
