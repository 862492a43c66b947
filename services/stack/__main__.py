from services.stack.cli import main

main()
