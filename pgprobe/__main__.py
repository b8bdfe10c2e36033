from pgprobe.cli import main

raise SystemExit(main())
