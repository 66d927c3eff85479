from headlens.cli import main

main()
