"""Transport backends: one module per broker, each a `jobq.ports.Transport`.

`memory` is the single-process reference implementation (tests, examples); `sqlite` is the
embedded default, a queue table in the same database file as the store. Only the composition
root imports a backend; everything else depends on the port.
"""
