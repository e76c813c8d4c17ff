"""The cost model before a cell runs: step time, memory, layouts, intervals and the arithmetic of cost."""
