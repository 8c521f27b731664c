# bench/serve/plot.gp: strata serve on ladder at 1 GB: aggregate tokens/s and the
# latencies against concurrent clients (gnuplot -e "csv='...'; out='...'" plot.gp).
set datafile separator ","
set terminal pngcairo size 1000,540 noenhanced
set output out
set multiplot layout 1,2 title "strata serve: concurrent streaming clients (ladder model, 1 GB budget)"
set logscale x 2
set grid
set key left top
set key box opaque
set xlabel "concurrent clients"
set ylabel "aggregate tokens/s"
plot csv using 2:6 every ::1 with linespoints lw 2 title "tokens/s"
set ylabel "seconds"
set key below
plot csv using 2:7 every ::1 with linespoints lw 2 title "time to first token p50", \
     csv using 2:8 every ::1 with linespoints lw 1 dt 2 title "time to first token p99", \
     csv using 2:9 every ::1 with linespoints lw 2 title "inter-token p50", \
     csv using 2:10 every ::1 with linespoints lw 1 dt 2 title "inter-token p99"
unset multiplot
