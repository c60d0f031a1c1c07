"""Results, read only from files: the results store (TSV + JSON twin, :mod:`.store`), the
environment dump (:mod:`.environment`), statistics of repeats (:mod:`.stats`), Figure 7
tables and speedups (:mod:`.summary`) and plots (:mod:`.plot`)."""
