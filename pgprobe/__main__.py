from pgprobe.launch import main

raise SystemExit(main())
