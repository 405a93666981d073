"""edgesched.central"""
