"""The daemons: beat materialises runs, the scanner dispatches them, workers run them, the reaper
takes back expired leases. Each has `run_once(now_ms)` and `run_forever(stop)`."""
