"""edgesched.edge"""
