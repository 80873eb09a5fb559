"""Issue 28's paused former owner, with nothing faked: two workers (`tests/apps.py`) share one
FileStore directory behind the real node and Redis. The owner of `/threads/n` is SIGSTOPped
while it holds a note it is about to save, past its lease; the node places the instance on the
other worker at a higher epoch, which saves its own note. SIGCONTed, the former owner saves its
late note with its old epoch: the store refuses it, and the new owner's note stands."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
from support import Redis, StartNode, StartWorker, WorkerProcess, eventually

import pinboard_worker
from pinboard_worker import Fence

LEASE_S = 2.0


def _notes(worker: WorkerProcess, step: str) -> list[dict[str, str]]:
    return [n for n in worker.info()["notes"] if n["id"] == "n" and n["step"] == step]


def test_a_paused_former_owners_late_save_is_refused_and_the_new_owners_note_stands(
    redis: Redis, start_node: StartNode, start_worker: StartWorker, tmp_path: Path
) -> None:
    node = start_node(env={"PINBOARD_LEASE_TTL_MS": str(int(LEASE_S * 1000))})
    store_dir = tmp_path / "notes"
    former = start_worker(node.url, client_id="worker-1", store=store_dir)

    # The only worker yet takes the note, and waits 1.5 s before saving it: it is paused then.
    late: list[httpx.Response | Exception] = []

    def put_late() -> None:
        with httpx.Client(base_url=node.url, timeout=60, trust_env=False) as client:
            try:
                late.append(client.put("/threads/n/note?after_ms=1500", content=b"late"))
            except httpx.HTTPError as e:
                late.append(e)

    sender = threading.Thread(target=put_late)
    sender.start()
    eventually(lambda: _notes(former, "saving"), 15, lambda: f"the note taken\n{former.log()}")
    former.proc.send_signal(signal.SIGSTOP)
    try:
        row = redis.row("/threads", "n")
        assert row is not None
        former_epoch: str = row["epoch"]

        # Past its lease, the instance is placed on the other worker, at a higher epoch, which
        # saves its own note.
        heir = start_worker(node.url, client_id="worker-2", store=store_dir)
        time.sleep(LEASE_S + 0.5)

        def heir_saves() -> httpx.Response | None:
            reply = node.client.put("/threads/n/note", content=b"heir")
            return reply if reply.status_code == 200 else None

        saved = eventually(heir_saves, 15, lambda: f"the heir's save\n{node.log()}").json()
        heir_epoch: str = saved["epoch"]
        assert saved == {"saved": True, "epoch": heir_epoch}
        assert _notes(heir, "saved") == [{"id": "n", "epoch": heir_epoch, "step": "saved"}]
        assert Fence(heir_epoch) > Fence(former_epoch), (heir_epoch, former_epoch)
    finally:
        former.proc.send_signal(signal.SIGCONT)

    # The former owner resumes and saves its late note at its old epoch: refused.
    refusal = f"stale epoch: stored {heir_epoch}, offered {former_epoch}"
    refused = eventually(
        lambda: _notes(former, "refused"), 15, lambda: f"the late save\n{former.log()}"
    )
    assert refused == [{"id": "n", "epoch": former_epoch, "step": "refused", "detail": refusal}]
    assert _notes(former, "saved") == [], "the late note was never saved"
    # Its answer is withheld (its lease lapsed): the late request is not answered 200.
    sender.join(60)
    assert len(late) == 1
    assert not isinstance(late[0], httpx.Response) or late[0].status_code != 200, late[0]

    # The heir's note stands, in the store (at its epoch) and through the node.
    store = pinboard_worker.FileStore(store_dir)
    assert store.load("/threads", "n") == b"heir"
    header = store.path_of("/threads", "n").read_bytes().split(b"\n")[0]
    assert header.endswith(f" {heir_epoch}".encode()), header
    assert node.client.get("/threads/n/note").json() == {"note": "heir"}
