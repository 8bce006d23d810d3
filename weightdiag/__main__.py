from weightdiag.cli import main

main()
