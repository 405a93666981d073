"""edgesched.core: the pure scheduling core shared by central, edge nodes and the simulator.

No I/O, no clock, no asyncio: functions of (nodes, tasks, placements, policy, time) that return
decisions.
"""
