"""The scheduler: a tensor graph (a SINK of values to realize) becomes an ordered list of CALLs (docs/PIPELINE.md §2).

>>> from tiny_uop import Ops, UOp, dtypes
>>> from tiny_codegen.schedule import create_schedule
>>> a = UOp.new_buffer("CPU", 12, dtypes.float32).reshape((3, 4))
>>> sched = create_schedule(UOp.sink((a * 2 + 1).r(Ops.ADD, (1,))))
>>> len(sched.calls)
1
"""
from tiny_codegen.schedule.memory import memory_plan
from tiny_codegen.schedule.schedule import ScheduleResult, cached_template, clear_schedule_cache, create_schedule

__all__ = ["ScheduleResult", "cached_template", "clear_schedule_cache", "create_schedule", "memory_plan"]
