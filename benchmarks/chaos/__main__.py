from benchmarks.chaos.cli import chaos_command

if __name__ == "__main__":
    chaos_command()
