#!/usr/bin/env python3
"""run.metrics_port scraped by a real Prometheus server (Debian's `prometheus`), on loopback:
 - the test starts Prometheus with a temporary configuration (the trainer's endpoint scraped every
   second) and storage directory, runs 2-rank training of configs/fashion_mlp.ini long enough for
   several scrapes, then asks Prometheus's HTTP API (/api/v1/query) in PromQL for the step, the
   loss (equal to metrics.jsonl's), both ranks' allocator bytes, the checkpoints written (equal to
   the log's count) and the exit cause, which only the last scrape at exit can have seen; a resumed
   run then shows meshtrain_resumes_total 1;
 - a port already in use is a warning naming it, and the run still exits 0 (and writes metrics.prom);
 - a bind address that is not an IP literal is refused naming the key (exit 2).
Skips (exit 77) only when the prometheus program is not installed (scripts/install_deps.sh installs it)."""
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

TRAINER = os.environ["TRAINER"]
FASHION = os.environ["FASHION_H5"]
SRC = os.environ["SOURCE_DIR"]
MPI = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_cmd(d, name, port, *extra):
    return MPI + ["-np", "2", TRAINER, "--config", os.path.join(SRC, "configs/fashion_mlp.ini"),
                  f"--data.path={FASHION}", f"--run.dir={d}", f"--run.name={name}", "--data.num_workers=1",
                  "--run.log_interval=5", "--train.eval_interval=100000", f"--run.metrics_port={port}",
                  "--run.metrics_bind=127.0.0.1", *extra]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Prometheus:
    """A Prometheus server on loopback scraping 127.0.0.1:<target> every second, with its own storage."""

    def __init__(self, workdir, target):
        self.port = free_port()
        self.dir = workdir
        cfg = os.path.join(workdir, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: meshtrain\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{target}']\n")
        self.log = open(os.path.join(workdir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                http_get(f"http://127.0.0.1:{self.port}/-/ready", timeout=2)
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise AssertionError("prometheus did not become ready: " + self.logtail())
                time.sleep(0.2)

    def logtail(self):
        self.log.flush()
        with open(os.path.join(self.dir, "prometheus.log")) as f:
            return f.read()[-3000:]

    def query(self, promql):
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        answer = json.loads(http_get(url))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def query_range(self, promql, seconds=600):
        """What a Grafana panel asks: the expression over the last `seconds`, a point a second."""
        now = time.time()
        url = f"http://127.0.0.1:{self.port}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": promql, "start": now - seconds, "end": now, "step": "1"})
        answer = json.loads(http_get(url))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def value(self, promql):
        """The single sample an instant query returns, as a float (None when there is none)."""
        result = self.query(promql)
        assert len(result) <= 1, (promql, result)
        return float(result[0]["value"][1]) if result else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()


def step_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == "step"]


class PrometheusScrape(unittest.TestCase):
    def test_prometheus_scrapes_a_two_rank_run(self):
        with tempfile.TemporaryDirectory() as d:
            port = free_port()
            prom = Prometheus(d, port)
            try:
                self.scrape_run(d, prom, port)
            finally:
                prom.stop()

    def scrape_run(self, d, prom, port):
        # The run lasts until Prometheus has scraped it several times (however fast this machine
        # trains), then a stop signal ends it: exit 0, cause "preempted", which only the last
        # scrape at exit (run.metrics_linger_s) can see.
        log_path = os.path.join(d, "scraped.log")
        started = time.time()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(train_cmd(d, "scraped", port, "--train.max_steps=1000000",
                                              "--checkpoint.interval=100", "--run.metrics_linger_s=20"),
                                    stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.time() + 90
                while True:
                    scrapes = prom.value("count_over_time(meshtrain_step[10m])") or 0
                    step = prom.value("max_over_time(meshtrain_step[10m])") or 0
                    if scrapes >= 4 and step >= 250:
                        break
                    self.assertIsNone(proc.poll(), "the run ended before it was scraped")
                    self.assertLess(time.time(), deadline, f"{scrapes} scrapes, step {step} after 90 s")
                    time.sleep(0.5)
                proc.send_signal(signal.SIGUSR1)  # mpirun forwards it to every rank
                rc = proc.wait(timeout=120)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
        with open(log_path) as f:
            out = f.read()
        self.assertEqual(rc, 0, out[-3000:])
        print(f"training run: {time.time() - started:.1f} s")
        self.assertIn(f"serving Prometheus metrics on http://127.0.0.1:{port}/metrics", out)
        self.assertNotIn("no scrape within run.metrics_linger_s", out)
        stopped = int(re.search(r"preempted at step (\d+) of 1000000", out).group(1))
        window = "[10m]"
        scrapes = prom.value(f"count_over_time(meshtrain_step{window})")
        print(f"scrapes of the run: {scrapes:.0f}, stopped at step {stopped}")
        self.assertEqual(prom.value(f"max_over_time(meshtrain_step{window})"), stopped)
        self.assertEqual(prom.value(f"last_over_time(meshtrain_steps_planned{window})"), 1000000)
        self.assertEqual(prom.value(f"max_over_time(meshtrain_samples_total{window})"), stopped * 128)
        self.assertEqual(prom.value(f'max_over_time(meshtrain_exits_total{{cause="preempted"}}{window})'), 1)
        self.assertEqual(prom.value(f'max_over_time(meshtrain_exits_total{{cause="failure"}}{window})'), 0)
        # The loss Prometheus holds last is the one metrics.jsonl ends with, and it trained.
        records = step_records(os.path.join(d, "scraped"))
        last_loss = prom.value(f"last_over_time(meshtrain_loss{window})")
        self.assertTrue(math.isfinite(last_loss))
        self.assertAlmostEqual(last_loss, records[-1]["loss"], places=9)
        self.assertEqual(prom.value(f"last_over_time(meshtrain_logged_step{window})"), records[-1]["step"])
        self.assertLess(last_loss, records[0]["loss"])
        # Both ranks' figures, each through rank 0's endpoint.
        for name in ("meshtrain_allocator_allocated_bytes", "meshtrain_allocator_peak_bytes",
                     "meshtrain_compute_seconds", "meshtrain_data_wait_ratio"):
            series = prom.query(f"last_over_time({name}{window})")
            self.assertEqual(sorted(s["metric"]["rank"] for s in series), ["0", "1"], (name, series))
            if "bytes" in name:
                for s in series:
                    self.assertGreater(float(s["value"][1]), 0, (name, s))
        self.assertIn(prom.value(f"last_over_time(meshtrain_straggler_rank{window})"), (0.0, 1.0))
        self.assertGreater(prom.value(f"max_over_time(meshtrain_samples_per_second{window})"), 0)
        # Checkpoints: every 100 steps and the one at the stop, as many as the log reports.
        written = sum(1 for l in out.splitlines() if "checkpoint " in l and " written in " in l)
        self.assertGreaterEqual(written, 3, out[-2000:])
        self.assertEqual(prom.value(f"max_over_time(meshtrain_checkpoints_written_total{window})"), written)
        self.assertEqual(prom.value(f"max_over_time(meshtrain_checkpoint_step{window})"), stopped)
        self.assertGreater(prom.value(f"max_over_time(meshtrain_checkpoint_duration_seconds{window})"), 0)
        # Prometheus itself found every exposition well-formed: each scrape of the run was up.
        ups = prom.value(f'sum_over_time(up{{job="meshtrain"}}{window})')
        self.assertEqual(ups, scrapes)
        # The final snapshot on disk says the same.
        with open(os.path.join(d, "scraped", "metrics.prom")) as f:
            self.assertIn('meshtrain_exits_total{cause="preempted"} 1\n', f.read())

        # Resumed for 20 more steps: the run's history counts one resume, this process finishes.
        p = subprocess.run(train_cmd(d, "scraped", port, f"--train.max_steps={stopped + 20}",
                                     "--run.metrics_linger_s=20"), capture_output=True, text=True, timeout=240)
        self.assertEqual(p.returncode, 0, (p.stdout + p.stderr)[-3000:])
        self.assertEqual(prom.value(f"max_over_time(meshtrain_resumes_total{window})"), 1)
        self.assertEqual(prom.value(f"max_over_time(meshtrain_step{window})"), stopped + 20)
        self.assertEqual(prom.value(f'max_over_time(meshtrain_exits_total{{cause="finished"}}{window})'), 1)
        # A new process starts its counters afresh, as Prometheus expects of a restart.
        self.assertEqual(prom.value(f"resets(meshtrain_steps_total{window})"), 1)
        self.check_dashboard(prom)

    def check_dashboard(self, prom):
        """Every query of scripts/grafana/meshtrain.json is PromQL this Prometheus accepts, the main
        panels have data from the run, and every metric the dashboard names is documented."""
        with open(os.path.join(SRC, "scripts/grafana/meshtrain.json")) as f:
            dash = json.load(f)
        with open(os.path.join(SRC, "docs/metrics.md")) as f:
            documented = set(re.findall(r"`(meshtrain_[a-z_]+)`", f.read()))
        self.assertGreater(len(dash["panels"]), 10)
        answered = {}
        for panel in dash["panels"]:
            self.assertTrue(panel["targets"], panel["title"])
            for t in panel["targets"]:
                expr = (t["expr"].replace("$instance", ".*").replace("$__range", "10m")
                        .replace("$__rate_interval", "1m"))
                for name in re.findall(r"meshtrain_[a-z_]+", expr):
                    self.assertIn(name, documented, f"{name} (panel {panel['title']}) is not in docs/metrics.md")
                answered.setdefault(panel["title"], []).append(prom.query_range(expr))
        for title in ("Step", "Loss", "Throughput", "Allocator bytes per rank", "Checkpoints", "Exits by cause",
                      "Straggler", "Data wait share per rank", "Communication wait per rank", "Resumes", "Restarts"):
            self.assertTrue(any(answered[title]), f"panel {title} shows nothing")

    def test_port_in_use_is_a_warning(self):
        with tempfile.TemporaryDirectory() as d, socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            p = subprocess.run(train_cmd(d, "busy", port, "--train.max_steps=10"), capture_output=True, text=True,
                               timeout=240)
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, out[-3000:])
            self.assertIn(f"run.metrics_port {port}: cannot serve metrics on 127.0.0.1:{port}", out)
            self.assertIn("Address already in use", out)
            self.assertIn("final test_accuracy=", out)
            with open(os.path.join(d, "busy", "metrics.prom")) as f:
                text = f.read()
            self.assertIn('meshtrain_exits_total{cause="finished"} 1\n', text)
            self.assertIn("meshtrain_step 10\n", text)

    def test_bind_must_be_an_address(self):
        with tempfile.TemporaryDirectory() as d:
            cmd = train_cmd(d, "badbind", 9, "--train.max_steps=2")
            cmd[cmd.index("--run.metrics_bind=127.0.0.1")] = "--run.metrics_bind=localhost"
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 2, (p.stdout + p.stderr)[-2000:])
            self.assertIn("run.metrics_bind", p.stderr)
            self.assertIn("'localhost' is not an IP address", p.stderr)

    def test_bad_port_or_linger_is_refused_before_serving(self):
        # Checked before the server starts: no endpoint on a port nobody asked for (-1 used to
        # serve on 65535), no hour-long linger on the way out (1e9 s used to hang the exit).
        with tempfile.TemporaryDirectory() as d:
            for extra, key in ((["--run.metrics_port=-1"], "run.metrics_port"),
                               ([f"--run.metrics_port={free_port()}", "--run.metrics_linger_s=1e9"],
                                "run.metrics_linger_s")):
                cmd = train_cmd(d, "badport", 0, "--train.max_steps=2", *extra)
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                out = p.stdout + p.stderr
                self.assertEqual(p.returncode, 2, out[-2000:])
                self.assertIn(key, p.stderr)
                self.assertNotIn("serving Prometheus metrics", out)

    def test_setup_failure_linger_names_no_missing_file(self):
        # A run that fails before it has a run directory (a data file that does not exist) still
        # serves its exit cause for the linger, and then says its figures were not saved: it used
        # to point at "<run_dir>/metrics.prom", a file nobody wrote.
        with tempfile.TemporaryDirectory() as d:
            cmd = train_cmd(d, "nodata", free_port(), "--data.path=" + os.path.join(d, "missing.h5"),
                            "--run.metrics_linger_s=0.5")
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 2, out[-2000:])
            self.assertIn("missing.h5", out)
            self.assertIn("exit cause bad_input", out)
            self.assertIn("they were not saved (the run failed before it had a run directory)", out)
            self.assertNotIn("<run_dir>", out)

    def test_stop_signal_ends_the_linger(self):
        # A finished run waiting up to 600 s for a last scrape that never comes leaves within
        # seconds of a SIGTERM (a scheduler's stop is not held up by run.metrics_linger_s).
        with tempfile.TemporaryDirectory() as d:
            cmd = train_cmd(d, "linger", free_port(), "--train.max_steps=3", "--run.metrics_linger_s=600")[5:]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            lines = []
            for line in p.stdout:
                lines.append(line)
                if "serving the final metrics" in line:
                    break
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            rest, _ = p.communicate(timeout=30)
            self.assertLess(time.monotonic() - t0, 5, rest)
            self.assertEqual(p.returncode, 0, "".join(lines) + rest)
            self.assertIn("stop signal: no longer waiting for a scrape", rest)


if __name__ == "__main__":
    if PROMETHEUS is None:
        print("SKIP: the prometheus program is not installed (Debian package `prometheus`, which "
              "scripts/install_deps.sh installs); the scrape test needs a real server")
        sys.exit(77)
    unittest.main(verbosity=2)
