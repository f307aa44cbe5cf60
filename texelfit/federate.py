"""`texelfit federate DIR`: federated learning of a built bundle between browsers, through Flower.

Flower does the federation: this process holds a SuperLink's link state (`InMemoryLinkState`, the
state `flower-superlink` keeps in memory), and runs a ServerApp's strategy (FedAvg, FedAdam or
FedProx, optionally wrapped in `DifferentialPrivacyClientSideFixedClipping`) on it through Flower's
`InMemoryGrid`, in a thread. The browsers reach it through the bridge (`texelfit.bridge`): each
browser session is one Flower node, registered in the link state when the browser joins, kept
online by its heartbeats; the bridge does for that node what a SuperNode's Fleet API client does
(pull its message, push its reply), with the browser as the ClientApp. Flower's strategy samples
the nodes, waits for their replies (up to the round timeout; a node whose heartbeats stop is
replied for by the link state with an error, so a closed page ends the wait early) and aggregates.
Nothing here aggregates.
"""
from __future__ import annotations

import base64
import dataclasses
import logging
import random
import secrets
import threading
import time
from uuid import uuid4

import numpy as np

from texelfit.federate_setup import Bundle, Settings, make_strategy

ARRAYS, CONFIG, METRICS = "arrays", "config", "metrics"  # the keys of Flower's FedAvg family
NORM_SLACK = 1e-6  # (relative) float32 rounding of a delta clipped to exactly the bound


class _NoEvaluateNote(logging.Filter):
    """Drops Flower's warning that federated evaluation is off: it is (the global model is evaluated here)."""

    def filter(self, record):
        return "Federated evaluation will be skipped" not in record.getMessage()


class Refused(Exception):
    """An HTTP 4xx for the browser, with the reason logged."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


@dataclasses.dataclass
class Session:
    number: int
    node_id: int
    task: object = None  # the Flower Message (TRAIN) this browser holds, until it replies
    round: int = 0


class Federation:
    """One federation: Flower's link state and strategy, and the sessions of the browsers in it.

    `evaluate(arrays) -> {"loss", "accuracy"}` (optional) scores a global model; `report(entry)` is called
    after round 0 (the start) and every round with {round, clients, arrays, metrics}."""

    def __init__(self, bundle: Bundle, settings: Settings, *, evaluate=None, report=None, log=None):
        from flwr.app import Array, ArrayRecord
        from flwr.common.constant import RUN_ID_NUM_BYTES, SUPERLINK_NODE_ID, TASK_ID_NUM_BYTES
        from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
        from flwr.server.superlink.linkstate import LinkStateFactory
        from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
        from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
        from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
        from flwr.supercore.object_store import ObjectStoreFactory
        from flwr.supercore.run import Run
        from flwr.supercore.task_identity import TaskIdentity
        from flwr.superlink.federation import NoOpFederationManager
        from flwr.superlink.grid import InMemoryGrid

        self.bundle, self.settings = bundle, settings
        self.names = list(bundle.trainable)
        self.sizes = [int(np.prod(bundle.shapes[n])) for n in self.names]
        flower = logging.getLogger("flwr")  # Flower's INFO lines: our progress says it; its warnings stay
        flower.setLevel(logging.WARNING)
        if not any(isinstance(f, _NoEvaluateNote) for f in flower.filters):
            flower.addFilter(_NoEvaluateNote())
        self.strategy = make_strategy(settings)
        self.evaluate, self.report = evaluate, report
        self.log = log or (lambda line: print(f"texelfit: federate: {line}", flush=True))
        self.state_factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
        self.state = self.state_factory.state()
        run = Run.create_empty(run_id=generate_rand_int_from_bytes(RUN_ID_NUM_BYTES))
        run.primary_task_id = generate_rand_int_from_bytes(TASK_ID_NUM_BYTES)
        run.federation_id = NOOP_FEDERATION_ID
        self.state.run_ids[run.run_id] = RunRecord(run=run)
        self.state.task_store[run.primary_task_id] = Task(task_id=run.primary_task_id, run_id=run.run_id)
        # the ServerApp's identity, which Flower's Message reads (a process runs one federation at a time)
        TaskIdentity.task_id, TaskIdentity.run_id = run.primary_task_id, run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        self.grid = InMemoryGrid(state_factory=self.state_factory, pull_interval=0.02)
        self.grid.set_run(run)
        self.initial = ArrayRecord({n: Array(np.ascontiguousarray(bundle.initial[n], dtype=np.float32))
                                    for n in self.names})
        self.lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.told_over: set[str] = set()  # the tokens of sessions a task answer told the federation is over
        self.joined = 0
        self.round = 0
        self.contributors: dict[int, list[int]] = {}  # round -> the session numbers whose update went in
        self.history: list[dict] = []
        self.global_weights = {n: self.bundle.initial[n] for n in self.names}
        self.result = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="texelfit-serverapp", daemon=True)

    # ---- the ServerApp --------------------------------------------------------------------------

    def start(self) -> "Federation":
        self.thread.start()
        return self

    def _serve(self):
        from flwr.app import ConfigRecord

        try:
            if self.settings.seed is not None:  # Flower samples nodes with `random` and draws DP noise from numpy's
                random.seed(self.settings.seed)
                np.random.seed(self.settings.seed)
            self.result = self.strategy.start(grid=self.grid, initial_arrays=self.initial,
                                              num_rounds=self.settings.rounds, timeout=self.settings.round_timeout,
                                              train_config=ConfigRecord(self.settings.fit_config()),
                                              evaluate_fn=self._after_round)
        except BaseException as e:  # noqa: BLE001 (reported by wait())
            self.error = e
        finally:
            self.done.set()

    def _after_round(self, server_round: int, arrays):
        """Flower's evaluate_fn: called with the global arrays at the start (round 0) and after each round."""
        from flwr.app import MetricRecord

        weights = {n: np.asarray(a, dtype=np.float32).reshape(self.bundle.shapes[n])
                   for n, a in zip(arrays.keys(), arrays.to_numpy_ndarrays())}
        metrics = self.evaluate(weights) if self.evaluate else {}
        with self.lock:
            self.round = server_round
            self.global_weights = weights
            entry = {"round": server_round, "clients": list(self.contributors.get(server_round, [])),
                     "arrays": weights, "metrics": metrics}
            self.history.append(entry)
        if self.report:
            self.report(entry)
        return MetricRecord(metrics) if metrics else None

    def wait(self, timeout: float | None = None):
        if not self.done.wait(timeout):
            raise TimeoutError("the federation did not finish in time")
        if self.error is not None:
            raise self.error
        return self.global_weights

    def full_weights(self) -> dict[str, np.ndarray]:
        """Every weight of the bundle: the frozen ones as shipped, the trainable ones the global model's."""
        return {**self.bundle.initial, **self.global_weights}

    # ---- the Fleet side: one Flower node per browser session --------------------------------------

    def _session(self, token: str) -> Session:
        s = self.sessions.get(token or "")
        if s is None:
            raise Refused(401, "no valid session token")
        return s

    def join(self, weights=None) -> dict:
        """A new session (one Flower node). `weights`: the page's [[name, size], ...] (its bundle's), which must
        hold the federation's tensors."""
        if self.done.is_set():
            raise Refused(410, "the federation is over")
        if weights is not None:
            have = {w[0]: w[1] for w in weights if isinstance(w, list) and len(w) == 2}
            wrong = [f"{n} of {size} values" for n, size in zip(self.names, self.sizes) if have.get(n) != size]
            if wrong:
                raise Refused(409, f"this page's model is not the federation's: its weights lack {', '.join(wrong)}")
        from flwr.common.constant import NOOP_ACCOUNT_NAME, NOOP_FLWR_AID

        node_id = self.state.create_node(NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32),
                                         heartbeat_interval=self.settings.heartbeat)
        self.state.acknowledge_node_heartbeat(node_id, self.settings.heartbeat)
        token = secrets.token_urlsafe(24)
        with self.lock:
            self.joined += 1
            self.sessions[token] = Session(self.joined, node_id)
        self.log(f"client #{self.joined} joined (node {node_id})")
        return {"token": token, "client": self.joined, "heartbeat": self.settings.heartbeat}

    def alive(self, token: str) -> Session:
        s = self._session(token)
        self.state.acknowledge_node_heartbeat(s.node_id, self.settings.heartbeat)
        return s

    def heartbeat(self, token: str) -> dict:
        """A page's heartbeat. One its timer sent while its last task call was being told the federation is over
        is answered {done}, not refused: the page did nothing wrong."""
        if token in self.told_over:
            return {"done": True}
        self.alive(token)
        return {}

    def leave(self, token: str) -> None:
        s = self._session(token)
        with self.lock:
            self.sessions.pop(token, None)
        self.state.deactivate_node(s.node_id)
        self.log(f"client #{s.number} left")

    def pull(self, token: str, wait: float = 2.0) -> dict:
        """The round's task for this browser: the global weights and Flower's fit config; {wait} when
        it has none yet, {done} (with the final global weights) when the federation is over."""
        s = self.alive(token)
        end = time.monotonic() + wait
        while s.task is None:
            if self.done.is_set():
                with self.lock:
                    self.sessions.pop(token, None)  # told: the page is out
                    self.told_over.add(token)
                return {"done": True, **self._weights(self.global_weights if self.error is None else None)}
            msgs = self.state.get_message_ins(node_id=s.node_id, limit=1)
            if msgs:
                s.task = msgs[0]
                s.round = int(msgs[0].content[CONFIG]["server-round"])
                break
            if time.monotonic() > end:
                return {"wait": True}
            time.sleep(0.03)
            self.state.acknowledge_node_heartbeat(s.node_id, self.settings.heartbeat)
        arrays = s.task.content[ARRAYS]
        config = dict(s.task.content[CONFIG])
        weights = dict(zip(arrays.keys(), arrays.to_numpy_ndarrays()))
        return {"round": s.round, "config": {"epochs": config["local-epochs"], "batchSize": config["batch-size"],
                                             "optimizer": config["optimizer"], "lr": config["lr"],
                                             "shuffle": config["shuffle"], "quantize": config["quantize"],
                                             # --dp-clip: the page clips its delta to this L2 norm before it sends it
                                             "clip": self.settings.dp_clip,
                                             # FedProx's mu (its strategy adds it): the page's fit has the proximal term
                                             "proximalMu": float(config.get("proximal-mu", 0.0))},
                **self._weights(weights)}

    def _weights(self, weights) -> dict:
        if weights is None:
            return {}
        flat = np.concatenate([np.asarray(weights[n], "<f4").reshape(-1) for n in self.names])
        return {"names": self.names, "sizes": self.sizes, "weights": base64.b64encode(flat.tobytes()).decode()}

    def push(self, token: str, meta: dict, body: bytes) -> dict:
        """A browser's update for its round: checked, then Flower's reply to its TRAIN message (global +
        delta, weighted by its sample count). Anything wrong raises Refused and changes nothing."""
        s = self._session(token)
        try:
            return self._push(s, meta, body)
        except Refused as e:
            self.log(f"refused an update from client #{s.number} (HTTP {e.status}): {e}")
            raise

    def _push(self, s: Session, meta: dict, body: bytes) -> dict:
        from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

        if not isinstance(meta, dict):
            raise Refused(400, "the update has no X-Texelfit-Update header of JSON")
        task, rnd = s.task, meta.get("round")
        if task is None or rnd != s.round:
            raise Refused(409, f"an update for round {rnd!r}, but this client holds "
                               f"{'no task' if task is None else f'round {s.round}'} (a replay or a stale round)")
        if meta.get("names") != self.names or meta.get("sizes") != self.sizes:
            raise Refused(400, f"the update's tensors {meta.get('names')!r} / sizes {meta.get('sizes')!r} are not the "
                               f"federation's {self.names} / {self.sizes}")
        samples = meta.get("samples")
        if not isinstance(samples, int) or isinstance(samples, bool) or not 0 < samples < 2 ** 31:
            raise Refused(400, f"samples must be a positive integer, got {samples!r}")
        delta = self._decode(meta.get("format"), body)
        bad = [n for n, d in zip(self.names, delta) if not np.isfinite(d).all()]
        if bad:
            raise Refused(422, f"non-finite values in {', '.join(bad)}")
        norm = float(np.sqrt(sum(float(np.dot(d.astype(np.float64), d.astype(np.float64))) for d in delta)))
        bound = self.settings.max_update_norm
        if bound is not None and norm > bound * (1 + NORM_SLACK):
            raise Refused(422, f"the update's L2 norm {norm:.4g} exceeds --max-update-norm {bound:g}")
        clip = self.settings.dp_clip
        if clip is not None:  # clipped in the page (what arrives here is clipped), up to int8's rounding
            slack = 0.5 * float(np.sqrt(sum(d.size * (np.abs(d).max(initial=0.0) / 127) ** 2 for d in delta))) \
                if meta.get("format") == "int8" else 0.0
            if norm > clip * (1 + NORM_SLACK) + slack:
                raise Refused(422, f"the update's L2 norm {norm:.4g} exceeds --dp-clip {clip:g}: the page must clip "
                                   "its update before it sends it")
        if rnd <= self.round:  # the round closed before this update (its timeout, or Flower dropped the node)
            return self._late(s, rnd)
        arrays = task.content[ARRAYS]
        new = ArrayRecord({n: Array(np.asarray(g, np.float32) + d.reshape(np.shape(g)))
                           for n, g, d in zip(arrays.keys(), arrays.to_numpy_ndarrays(), delta)})
        loss = meta.get("loss")
        metrics = {"num-examples": samples, **({"train_loss": float(loss)} if isinstance(loss, (int, float)) else {})}

        def client_app(msg, _context):
            return Message(RecordDict({ARRAYS: new, METRICS: MetricRecord(metrics)}), reply_to=msg)

        if self.settings.dp_clip is not None:  # Flower's client-side clipping mod, as a ClientApp runs it: the page
            # clipped already (checked above), so it changes nothing but float rounding
            from flwr.clientapp.mod import fixedclipping_mod

            reply = fixedclipping_mod(task, None, client_app)
            if reply.has_error():
                raise Refused(400, f"Flower's fixedclipping_mod refused the update: {reply.error.reason}")
        else:
            reply = client_app(task, None)
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        with self.lock:
            if self.state.store_message_res(reply) is None:
                return self._late(s, rnd)
            s.task = None
            self.contributors.setdefault(rnd, []).append(s.number)
        return {"ok": True, "round": rnd, "norm": norm}

    def _late(self, s: Session, rnd: int) -> dict:
        """A valid update too late for its round: not aggregated; the page goes on to the next round."""
        s.task = None
        self.log(f"client #{s.number}'s update for round {rnd} came after the round closed: not aggregated")
        return {"ok": False, "round": rnd, "late": True}

    def _decode(self, fmt, body: bytes) -> list[np.ndarray]:
        total, count = sum(self.sizes), len(self.sizes)
        if fmt == "float32":
            if len(body) != 4 * total:
                raise Refused(400, f"a float32 update of {len(body)} bytes; the tensors need {4 * total}")
            flat = np.frombuffer(body, "<f4").astype(np.float32)
        elif fmt == "int8":
            if len(body) != 4 * count + total:
                raise Refused(400, f"an int8 update of {len(body)} bytes; the tensors need {4 * count + total}")
            scales = np.frombuffer(body, "<f4", count).astype(np.float32)
            q = np.frombuffer(body, np.int8, total, 4 * count).astype(np.float32)
            flat = q * np.repeat(scales, self.sizes)
        else:
            raise Refused(400, f"the update's format must be float32 or int8, got {fmt!r}")
        return np.split(flat, np.cumsum(self.sizes)[:-1])

    def status(self) -> dict:
        with self.lock:
            last = self.history[-1] if self.history else {"round": 0, "metrics": {}}
            return {"round": self.round, "rounds": self.settings.rounds, "clients": len(self.sessions),
                    "done": self.done.is_set(), **{k: last["metrics"].get(k) for k in ("loss", "accuracy")}}
