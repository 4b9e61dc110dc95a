"""Start `vigil serve` N times and print its resident memory once /health answers.
Usage: python probe.py VIGIL_BIN N (SmolLM2 Q4_1 from $VIGIL_TEST_GGUF, as the API tests)."""
import subprocess, sys, time, tempfile, socket, re, os, httpx
binp, n = sys.argv[1], int(sys.argv[2])
model = os.environ.get("VIGIL_TEST_GGUF", ".cache/SmolLM2-135M-Instruct.Q4_1.gguf")
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
for r in range(n):
    p = port(); sd = tempfile.mkdtemp()
    proc = subprocess.Popen([binp, "serve", "--model", model, "--host", "127.0.0.1", "--port", str(p), "--threads", "2",
                             "--state-dir", sd, "--kv-memory", "256MiB"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    t0 = time.time()
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{p}/health", timeout=1).status_code == 200: break
        except Exception: pass
        time.sleep(0.05)
    st = open(f"/proc/{proc.pid}/status").read()
    f = {k: int(re.search(rf"{k}:\s+(\d+)", st).group(1)) // 1024 for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
    # per-mapping rss
    maps = []; cur = None
    for line in open(f"/proc/{proc.pid}/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line): cur = line.split(); size = 0
        elif line.startswith("Rss:"):
            kb = int(line.split()[1])
            if kb > 4096: maps.append((kb // 1024, cur[0], cur[-1] if len(cur) > 5 else "[anon]"))
        elif line.startswith("AnonHugePages:") and cur: pass
    thp = sum(int(l.split()[1]) for l in open(f"/proc/{proc.pid}/smaps") if l.startswith("AnonHugePages:")) // 1024
    print(r, f"ready {time.time()-t0:.1f}s", f, "THP", thp, sorted(maps, reverse=True)[:8], flush=True)
    proc.terminate(); proc.wait()
