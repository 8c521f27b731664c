# gnuplot -e "csv='ladder.csv'; out='ladder.png'" plot.gp
# Decode s/token against the budget, beside the rung's physical limit:
# max(disk bytes / disk bandwidth, bytes touched / memory bandwidth), both
# bandwidths probed in the same run beside each rung (run.sh; columns 4, 15, 5).
set datafile separator ","
set terminal pngcairo size 900,500
set output out
set title "strata memory ladder: decode s/token and its physical limit vs RAM budget"
set xlabel "budget (GB)"
set ylabel "s/token"
set y2label "GB read per token"
set ytics nomirror
set y2tics
set logscale x 2
set logscale y 10
set key top right
# The resident rung has no budget: it is drawn at its peak RSS (column 10) and
# labelled, instead of being dropped as a non-numeric x.
x(c1, rss) = c1 eq "resident" ? rss : real(c1)
plot csv every ::1 using (x(strcol(1), $10)):4 with linespoints lw 2 title "decode s/token", \
     csv every ::1 using (x(strcol(1), $10)):15 with linespoints dt 2 lw 2 title "limit s/token", \
     csv every ::1 using (x(strcol(1), $10)):5 axes x1y2 with linespoints title "GB read/token", \
     csv every ::1 using (x(strcol(1), $10)):4:(strcol(1) eq "resident" ? "resident" : "") with labels offset 0,1 notitle
