"""Evolution API v2 simulator.

An outside system for Pilot Status: it answers over HTTP and publishes over RabbitMQ
the way the real Evolution API does (read from its source; simulator/README.md), and adds a
``/_control`` API for tests, benchmarks and fault injection.

It imports nothing from the product and the product imports nothing from it.
"""

__version__ = "2.3.7"  # the Evolution version whose behaviour is simulated
