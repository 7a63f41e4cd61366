"""The co-evolution engine: the loop, domains, curriculum reward, CLI, reports, audit and replay."""
