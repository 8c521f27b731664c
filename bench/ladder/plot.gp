# gnuplot -e "csv='ladder.csv'; out='ladder.png'" plot.gp
set datafile separator ","
set terminal pngcairo size 900,500
set output out
set title "strata memory ladder: decode s/token vs RAM budget"
set xlabel "budget (GB)"
set ylabel "s/token"
set y2label "GB read per token"
set ytics nomirror
set y2tics
set logscale x 2
set key top right
plot csv every ::1 using 1:4 with linespoints lw 2 title "decode s/token", \
     csv every ::1 using 1:6 with lines dt 2 title "I/O floor s/token", \
     csv every ::1 using 1:5 axes x1y2 with linespoints title "GB read/token"
