# perl building a big hash (string keys to small arrays), walking it sorted, deleting half and
# refilling it. SCALE: units of 50,000 keys.
source "$(dirname "$0")/common.sh"
case "$verb" in
  check) need perl perl-base ;;
  setup) ;;
  run) perl -e '
    my $n = 50_000 * $ARGV[0]; my %h;
    for my $i (1 .. $n) { $h{"key-$i-" . ($i * 7919 % 1000003)} = [$i, "value $i", $i % 97]; }
    my $sum = 0;
    for my $k (sort keys %h) { $sum += $h{$k}[2]; }
    my $i = 0;
    for my $k (keys %h) { delete $h{$k} if $i++ % 2; }
    for my $j (1 .. $n / 2) { $h{"new-$j"} = { id => $j, name => "n$j" }; }
    print STDERR "checksum $sum ", scalar(keys %h), "\n";' "$scale" ;;
esac
