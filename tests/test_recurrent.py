"""Recurrent layers (issue 32): nn.LSTM, nn.GRU and nn.RNN, exported unrolled over the build's sequence length
(prep/recurrent.py). One and two layers, one and two directions, batch_first or not, the output sequence, the
last hidden state h_n, an initial state of zeros or given as a second input, a sequence longer than one pass reads
(its steps' gradients summed in groups). Forward, every gradient
(backpropagation through time: every step's gradient of weight_hh summed into one tensor) and optimizer
trajectories from a fresh init against PyTorch, on WebGL2, rgba8 and the CPU backend; the trainable set is
named_parameters() under the state_dict names (weight_ih_l0, ..., bias_hh_l1_reverse). The same models from their
torch.onnx.export files (LSTM, GRU and RNN nodes, prep/recurrent_onnx.py) and a traced module, the same way.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import helpers
from helpers import FWD, GRAD, TRAJ_LOSS, TRAJ_W, assert_close, check_op, check_training, run_model
from texelfit.build import compile_onnx
from texelfit.prep.errors import BuildError
from texelfit.prep.load import export_simplified

BACKENDS = {"webgl": None, "cpu": {"backend": "cpu"}, "rgba8": {"precision": "rgba8"}}
T, FEAT, H = 6, 5, 8


class LastStep(nn.Module):
    """An LSTM (batch_first) and a head on its last step's output."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(FEAT, H, batch_first=True)
        self.head = nn.Linear(H, 4)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class DeepBidirectional(nn.Module):
    """Two bidirectional layers, sequence-first (the module transposes), a head on the first and last steps of the
    output sequence and on the last layer's final hidden states of both directions."""

    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(FEAT, H, num_layers=2, bidirectional=True)
        self.head = nn.Linear(6 * H, 3)

    def forward(self, x):
        out, state = self.rnn(x.transpose(0, 1))
        h_n = state[0] if isinstance(state, tuple) else state
        return self.head(torch.cat([out[0], out[-1], h_n[-2], h_n[-1]], 1))


class GRUTagger(nn.Module):
    """A GRU (batch_first) and a Linear on every step: an output per token, trained by mse."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(FEAT, H, batch_first=True)
        self.out = nn.Linear(H, 2)

    def forward(self, x):
        return self.out(self.rnn(x)[0])


def deep_lstm():
    return DeepBidirectional(nn.LSTM)


def deep_gru():
    return DeepBidirectional(nn.GRU)


def perturbed(factory):
    """Every parameter moved off its init (PyTorch's uniform init of the gates hides nothing, but the biases
    get values of their own)."""
    return helpers.perturbed(factory, 0.2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lstm_forward_and_every_gradient_through_time(web, site, backend):
    check_op(web, site, f"lstm_{backend}", perturbed(LastStep), (T, FEAT), "cross_entropy", batch=3,
             options=BACKENDS[backend])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_two_bidirectional_layers_forward_and_every_gradient(web, site, cell, backend):
    check_op(web, site, f"deep_{cell}_{backend}", perturbed({"lstm": deep_lstm, "gru": deep_gru}[cell]), (T, FEAT),
             "cross_entropy", batch=3, options=BACKENDS[backend])


@pytest.mark.parametrize("backend", ["webgl", "rgba8"])
def test_gru_per_step_outputs_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"gru_tagger_{backend}", perturbed(GRUTagger), (T, FEAT), "mse", batch=3,
             options=BACKENDS[backend])


def test_lstm_trains_as_pytorch_from_a_fresh_init(web, site):
    check_training(web, site, LastStep, (T, FEAT), "adam", "cross_entropy", samples=6, batch_size=3, epochs=2,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


def test_bidirectional_gru_trains_as_pytorch_on_the_cpu_backend(web, site):
    check_training(web, site, deep_gru, (T, FEAT), "sgd_momentum_wd", "cross_entropy", samples=6, batch_size=3,
                   epochs=1, tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, options={"backend": "cpu"})


class ReluRNN(nn.Module):
    """nn.RNN with relu, two layers, and a head on the mean of the output sequence."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(FEAT, H, num_layers=2, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(H, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0].mean(1))


@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_an_elman_rnn_forward_and_every_gradient(web, site, backend):
    check_op(web, site, f"rnn_relu_{backend}", perturbed(ReluRNN), (T, FEAT), "cross_entropy", batch=3,
             options=BACKENDS[backend])


class GivenState(nn.Module):
    """A GRU whose initial state is the model's second input, [N, H] a sample (h0 is [layers, N, H])."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(FEAT, H, batch_first=True)
        self.head = nn.Linear(H, 3)

    def forward(self, x, h0):
        return self.head(self.rnn(x, h0.unsqueeze(0))[1][0])


@pytest.mark.parametrize("source", ["module", "onnx_file"])
def test_an_initial_state_given_as_an_input(web, site, source):
    """h0 is the model's second input: from the module, and from its ONNX file, whose GRU node reads it as
    initial_h."""
    import io

    import onnx

    from texelfit.prep.simplify import simplify_onnx_file

    torch.manual_seed(2)
    model = perturbed(GivenState)().eval()
    shapes = [(T, FEAT), (H,)]
    if source == "module":
        onnx_model = export_simplified(model, shapes, ["x", "h0"])
    else:
        buf = io.BytesIO()
        torch.onnx.export(model, (torch.zeros(2, T, FEAT), torch.zeros(2, H)), buf, dynamo=False, opset_version=17,
                          input_names=["x", "h0"], output_names=["output"],
                          dynamic_axes={"x": {0: "batch"}, "h0": {0: "batch"}, "output": {0: "batch"}})
        onnx_model = simplify_onnx_file(onnx.load_from_string(buf.getvalue()), model.state_dict())
    result = compile_onnx(onnx_model, name="model", input_shape=shapes, max_batch=4)
    url = f"{site.add_files(f'rnn_given_state_{source}', result.files)}/model.js"
    g = torch.Generator().manual_seed(5)
    x, h0, y = torch.randn(3, T, FEAT, generator=g), torch.randn(3, H, generator=g), torch.tensor([0, 2, 1])
    got = run_model(web, url, """
        const x = { x: new Float32Array(args.x), h0: new Float32Array(args.h0) };
        return { out: Array.from(await m.predict(x, 3)), grads: arr(await m.gradients(x, Int32Array.from(args.y))) };
    """, {"x": x.reshape(-1).tolist(), "h0": h0.reshape(-1).tolist(), "y": y.tolist()})
    model.zero_grad()
    out = model(x, h0)
    F.cross_entropy(out, y).backward()
    assert_close("given state forward", got["out"], out.detach().numpy(), **FWD)
    named = dict(model.named_parameters())
    assert sorted(got["grads"]) == sorted(named)
    for name, p in named.items():
        assert_close(f"given state d/d{name}", got["grads"][name], p.grad.numpy(), **GRAD)


@pytest.mark.parametrize("module, message", [
    (lambda: nn.LSTM(FEAT, H, num_layers=2, dropout=0.3, batch_first=True), r"dropout=0.3 between layers"),
    (lambda: nn.LSTM(FEAT, H, proj_size=4, batch_first=True), r"proj_size=4"),
])
def test_what_is_not_supported_is_named(module, message):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = module()

        def forward(self, x):
            return self.rnn(x)[0].mean(1)

    with pytest.raises(BuildError, match=message):
        export_simplified(Net(), (T, FEAT))


LONG = 20  # steps: more readers of weight_hh than one pass reads (their gradients summed in groups first)


@pytest.mark.parametrize("steps", [11, 12, 15, 16])
def test_every_length_builds_its_optimizer_passes_within_the_texture_units(steps):
    """A tied parameter's last gradient sum is computed in its optimizer's pass, beside the anchor, the parameter
    and two moments: from 12 readers on (an LSTM of 12 to 16 steps, ALBERT-base's 12 layers) its readers are summed
    in groups first, or that pass would read more textures than one binds (a build error, before)."""
    torch.manual_seed(3)
    # (the schedule refuses a pass of more than MAX_INPUTS textures: "its kernel 'adam grad_sum x12' reads 16")
    compile_onnx(export_simplified(LastStep(), (steps, FEAT)), name="model", input_shape=(steps, FEAT), max_batch=4)


def test_an_lstm_of_13_steps_trains_as_pytorch(web, site):
    check_training(web, site, LastStep, (13, FEAT), "adam", "cross_entropy", samples=4, batch_size=2, epochs=1,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS)


@pytest.mark.parametrize("factory", [LastStep, GRUTagger], ids=["lstm_last_step", "gru_every_step"])
def test_a_sequence_longer_than_a_pass_reads(web, site, factory):
    check_op(web, site, f"long_{factory.__name__}", perturbed(factory), (LONG, FEAT),
             "cross_entropy" if factory is LastStep else "mse", batch=2)


class LastHidden(nn.Module):
    """One layer's h_n read as h_n[-1] (a stack of one state: an axis of size 1 before the batch)."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(FEAT, H, batch_first=True)
        self.head = nn.Linear(H, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[1][0][-1])


@pytest.mark.parametrize("backend", ["webgl", "cpu"])
def test_the_last_hidden_state_of_one_layer(web, site, backend):
    check_op(web, site, f"last_hidden_{backend}", perturbed(LastHidden), (T, FEAT), "cross_entropy", batch=3,
             options=BACKENDS[backend])


@pytest.mark.parametrize("factory", [LastStep, LastHidden, deep_lstm, deep_gru, GRUTagger, ReluRNN])
def test_the_torch_reference_of_the_graph_is_the_module(factory):
    """prep/torch_ir.py (what evaluate and the build's fine-tuning run) computes the module's output from the IR."""
    from texelfit.prep.graph import to_ir
    from texelfit.prep.torch_ir import IRModule

    torch.manual_seed(3)
    model = perturbed(factory)().eval()
    x = torch.randn(4, T, FEAT)
    graph = to_ir(export_simplified(model, (T, FEAT)), (T, FEAT))
    with torch.no_grad():
        assert_close(f"{factory.__name__} IR", IRModule(graph)(x).numpy(), model(x).numpy(), **FWD)


# ---- an ONNX file's LSTM, GRU and RNN nodes (prep/recurrent_onnx.py) ---------------------------------------------

@pytest.mark.parametrize("factory, backend", [
    (LastStep, "webgl"), (LastStep, "cpu"), (LastStep, "rgba8"), (deep_lstm, "webgl"), (deep_gru, "cpu"),
    (GRUTagger, "webgl"), (ReluRNN, "webgl"), (LastHidden, "cpu")],
    ids=["lstm_webgl", "lstm_cpu", "lstm_rgba8", "deep_lstm_webgl", "deep_gru_cpu", "gru_tagger_webgl",
         "rnn_relu_webgl", "last_hidden_cpu"])
def test_an_onnx_files_recurrent_nodes_forward_and_every_gradient(web, site, factory, backend):
    """torch.onnx.export's LSTM, GRU and RNN nodes (one per layer and direction pair, weights reordered into ONNX's
    gate order and concatenated) train the state_dict's tensors under their names, as the module does."""
    check_op(web, site, f"onnx_{factory.__name__}_{backend}", perturbed(factory), (T, FEAT),
             "mse" if factory is GRUTagger else "cross_entropy", batch=3, options=BACKENDS[backend], onnx_file=True)


def test_an_onnx_files_lstm_trains_as_pytorch_from_a_fresh_init(web, site):
    check_training(web, site, deep_lstm, (T, FEAT), "adam", "cross_entropy", samples=6, batch_size=3, epochs=1,
                   tol_w=TRAJ_W, tol_loss=TRAJ_LOSS, onnx_file=True)


def test_a_torchscript_modules_lstm_forward_and_every_gradient(web, site):
    """A traced module exports its nn.LSTM as an LSTM node (the module's forward is not ours to unroll): built as
    its steps, with the weights the exporter computed claimed back as the module's parameters."""
    def traced():
        return torch.jit.trace(perturbed(LastStep)().eval(), torch.zeros(2, T, FEAT))

    check_op(web, site, "torchscript_lstm", traced, (T, FEAT), "cross_entropy", batch=3)


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(FEAT, H, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0][:, -1]


class Nested(nn.Module):
    """The recurrent layer two modules deep ('/enc/enc.0/rnn/GRU_1'), without --weights to name anything back."""

    def __init__(self):
        super().__init__()
        self.enc = nn.ModuleList([_Encoder()])
        self.fc = nn.Linear(2 * H, 2)

    def forward(self, x):
        return self.fc(self.enc[0](x))


def test_an_onnx_files_recurrent_weights_are_named_by_their_module_path():
    import io

    import onnx

    from texelfit.prep.graph import to_ir
    from texelfit.prep.simplify import simplify_onnx_file

    m = Nested().eval()
    buf = io.BytesIO()
    torch.onnx.export(m, (torch.zeros(2, T, FEAT),), buf, dynamo=False, opset_version=17, input_names=["input"],
                      dynamic_axes={"input": {0: "batch"}})
    graph = to_ir(simplify_onnx_file(onnx.load_from_string(buf.getvalue())), (T, FEAT))
    assert sorted(graph.params) == sorted(dict(m.named_parameters()))
    state = m.state_dict()
    for name, p in graph.params.items():  # in PyTorch's gate order: the state_dict's tensors
        assert torch.equal(torch.from_numpy(p.array.T if p.transposed else p.array).reshape(state[name].shape), state[name]), name
