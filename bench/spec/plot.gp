# bench/spec/plot.gp: decode speed-up against drafted tokens per pass (all
# accepted), one line per budget (gnuplot -e "csv='...'; out='...'" plot.gp).
set datafile separator ","
set terminal pngcairo size 900,520 noenhanced
set output out
set title "strata --spec K: drafts verified in one pass (ladder, drafts = own greedy output)"
set xlabel "K (drafted tokens per pass)"
set ylabel "decode tokens/s relative to plain"
set key left top
set grid
plot csv using (strcol(2) eq "own" && $1 == 1 ? $3 : 1/0):6 with linespoints lw 2 title "1 GB budget", \
     csv using (strcol(2) eq "own" && $1 == 4 ? $3 : 1/0):6 with linespoints lw 2 title "4 GB budget"
