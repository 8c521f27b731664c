# bench/batch/plot.gp: aggregate decode tokens/s against sequences per step, one
# line per budget (gnuplot -e "csv='...'; out='...'" plot.gp).
set datafile separator ","
set terminal pngcairo size 900,520 noenhanced
set output out
set title "strata: sequences stepped together (ladder model, one weight pass per step)"
set xlabel "sequences per step"
set ylabel "aggregate decode tokens/s"
set logscale x 2
set key left top
set grid
plot csv using (strcol(2) eq "decode" && $1 == 1 ? $3 : 1/0):6 with linespoints lw 2 title "1 GB budget", \
     csv using (strcol(2) eq "decode" && $1 == 4 ? $3 : 1/0):6 with linespoints lw 2 title "4 GB budget"
